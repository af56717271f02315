#include "kernels/qk_grad/kernel.cuh"
#include "kernels/qk_grad/launch.hpp"

namespace cake::kernels::qk_grad {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int64_t const rows = params.num_tokens * params.num_qk_heads;
  if (rows == 0) return cudaSuccess;
  int64_t const rows_per_block = kThreads / 32;
  auto const blocks = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  qk_grad_kernel<<<blocks, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::qk_grad
