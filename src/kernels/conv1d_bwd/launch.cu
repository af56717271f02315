#include "kernels/conv1d_bwd/kernel.cuh"
#include "kernels/conv1d_bwd/launch.hpp"

namespace cake::kernels::conv1d_bwd {

cudaError_t launch(Params const& p, cudaStream_t stream) {
  return conv1d::dispatch(p.x_dtype, p.width, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int W = decltype(variant)::kWidth;
    if (has_tiles(p)) {
      conv1d::Grid const g = tile_grid<T>(p);
      cudaError_t const err = cudaFuncSetAttribute(
          conv1d_bwd_kernel<T, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTileSharedBytes);
      if (err != cudaSuccess) return err;
      conv1d_bwd_kernel<T, W><<<dim3(g.x, g.y), kThreads, kTileSharedBytes, stream>>>(p);
    }
    if (has_states(p)) {
      conv1d::Grid const g = state_grid(p);
      conv1d_state_bwd_kernel<T, W><<<dim3(g.x, g.y), kStateThreads, 0, stream>>>(p);
    }
    if (has_reduce(p)) {
      conv1d::Grid const g = reduce_grid(p);
      conv1d_reduce_kernel<<<dim3(g.x, g.y), kReduceThreads, sizeof(ReduceShared), stream>>>(p);
    }
    return cudaGetLastError();
  });
}

}  // namespace cake::kernels::conv1d_bwd
