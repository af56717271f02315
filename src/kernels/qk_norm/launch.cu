#include "kernels/qk_norm/kernel.cuh"
#include "kernels/qk_norm/launch.hpp"

namespace cake::kernels::qk_norm {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  if (params.num_rows == 0) return cudaSuccess;
  int64_t const rows_per_block = kThreads / 32;
  auto const blocks =
      static_cast<unsigned>((params.num_rows + rows_per_block - 1) / rows_per_block);
  qk_norm_kernel<<<blocks, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::qk_norm
