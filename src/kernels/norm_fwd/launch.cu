#include "kernels/norm_fwd/kernel.cuh"
#include "kernels/norm_fwd/launch.hpp"

namespace cake::kernels::norm_fwd {

cudaError_t launch(Params const& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  return norm::dispatch(p.x_dtype, p.layout.slots, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int S = decltype(variant)::kSlots;
    norm_fwd_kernel<T, S>
        <<<static_cast<unsigned>(p.layout.num_blocks), kThreads, smem_bytes(p), stream>>>(p);
    return cudaGetLastError();
  });
}

}  // namespace cake::kernels::norm_fwd
