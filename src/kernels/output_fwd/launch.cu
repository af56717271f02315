#include "kernels/output_fwd/kernel.cuh"
#include "kernels/output_fwd/launch.hpp"

namespace cake::kernels::output_fwd {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int const smem = sizeof(SharedStorage);
  cudaError_t err =
      cudaFuncSetAttribute(output_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  dim3 const grid(static_cast<unsigned>(params.problem.num_slots),
                  static_cast<unsigned>(params.problem.num_v_heads));
  output_fwd_kernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::output_fwd
