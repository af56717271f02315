#include "kernels/norm_bwd/kernel.cuh"
#include "kernels/norm_bwd/launch.hpp"

namespace cake::kernels::norm_bwd {

cudaError_t launch(Params const& p, cudaStream_t stream) {
  return norm::dispatch(p.x_dtype, p.layout.slots, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int S = decltype(variant)::kSlots;
    bool launched = false;
    if (p.rows > 0) {
      norm_bwd_kernel<T, S>
          <<<static_cast<unsigned>(p.layout.num_blocks), kThreads, smem_bytes(p), stream>>>(p);
      launched = true;
    }
    if (p.dweight != nullptr) {
      norm_reduce_kernel<<<reduce_blocks(p), kReduceThreads, kReduceSmemBytes, stream>>>(p);
      launched = true;
    }
    // Nothing launched: no launch error of this call to read (an earlier one is not ours).
    return launched ? cudaGetLastError() : cudaSuccess;
  });
}

}  // namespace cake::kernels::norm_bwd
