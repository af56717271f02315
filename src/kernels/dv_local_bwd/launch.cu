#include "kernels/dv_local_bwd/kernel.cuh"
#include "kernels/dv_local_bwd/launch.hpp"

namespace cake::kernels::dv_local_bwd {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int const smem = sizeof(SharedStorage);
  cudaError_t err = cudaFuncSetAttribute(dv_local_bwd_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  dim3 const grid(static_cast<unsigned>(params.problem.num_slots),
                  static_cast<unsigned>(params.problem.num_v_heads));
  dv_local_bwd_kernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::dv_local_bwd
