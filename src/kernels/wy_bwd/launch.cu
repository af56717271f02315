#include "kernels/wy_bwd/kernel.cuh"
#include "kernels/wy_bwd/launch.hpp"

namespace cake::kernels::wy_bwd {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int64_t const blocks = params.problem.num_slots * params.problem.num_v_heads;  // (slot, hv)
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;                  // gridDim.x < 2^31
  int const smem = sizeof(SharedStorage);
  cudaError_t err =
      cudaFuncSetAttribute(wy_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  wy_bwd_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::wy_bwd
