#include "kernels/kkt_solve/kernel.cuh"
#include "kernels/kkt_solve/launch.hpp"

namespace cake::kernels::kkt_solve {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int const smem = sizeof(SharedStorage);
  cudaError_t err =
      cudaFuncSetAttribute(kkt_solve_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  dim3 const grid(static_cast<unsigned>(params.problem.num_slots),
                  static_cast<unsigned>(params.problem.num_qk_heads));
  kkt_solve_kernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::kkt_solve
