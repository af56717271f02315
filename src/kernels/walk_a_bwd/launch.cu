#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_bwd/kernel.cuh"

namespace cake::kernels::walk_a_bwd {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int const smem = sizeof(SharedStorage);
  cudaError_t err = cudaFuncSetAttribute(walk_a_bwd_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // 1-D: walk_of_block maps each block to its (document, value head), longest documents first
  dim3 const grid(
      static_cast<unsigned>(int64_t{params.problem.num_seqs} * params.problem.num_v_heads));
  walk_a_bwd_kernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::walk_a_bwd
