#include "kernels/conv1d_fwd/kernel.cuh"
#include "kernels/conv1d_fwd/launch.hpp"

namespace cake::kernels::conv1d_fwd {

cudaError_t launch(Params const& p, cudaStream_t stream) {
  return conv1d::dispatch(p.x_dtype, p.width, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int W = decltype(variant)::kWidth;
    if (has_tiles(p)) {
      conv1d::Grid const g = tile_grid<T>(p);
      size_t const smem = tile_shared_bytes(p);
      cudaError_t const err = cudaFuncSetAttribute(
          conv1d_fwd_kernel<T, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess) return err;
      conv1d_fwd_kernel<T, W><<<dim3(g.x, g.y), kThreads, smem, stream>>>(p);
    }
    if (has_states(p)) {
      conv1d::Grid const g = state_grid(p);
      conv1d_state_kernel<T, W><<<dim3(g.x, g.y), kStateThreads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  });
}

}  // namespace cake::kernels::conv1d_fwd
