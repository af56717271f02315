#include "kernels/norm_bwd/kernel.cuh"
#include "kernels/norm_bwd/launch.hpp"

namespace cake::kernels::norm_bwd {

cudaError_t launch(Params const& p, cudaStream_t stream) {
  return norm::dispatch(p.x_dtype, p.slots, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int S = decltype(variant)::kSlots;
    if (p.rows > 0) {
      norm_bwd_kernel<T, S>
          <<<static_cast<unsigned>(p.num_blocks), kThreads, smem_bytes(p), stream>>>(p);
    }
    if (p.dweight != nullptr) {
      norm_reduce_kernel<<<reduce_blocks(p), kReduceThreads, kReduceSmemBytes, stream>>>(p);
    }
    return cudaGetLastError();
  });
}

}  // namespace cake::kernels::norm_bwd
