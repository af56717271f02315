#include <algorithm>

#include "kernels/common/device_sms.hpp"
#include "kernels/intra_bwd/kernel.cuh"
#include "kernels/intra_bwd/launch.hpp"

namespace cake::kernels::intra_bwd {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int const smem = sizeof(SharedStorage);
  cudaError_t err =
      cudaFuncSetAttribute(intra_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  int sms = 0;
  if ((err = current_sm_count(&sms)) != cudaSuccess) return err;
  // one CTA per SM (SharedStorage), each walking its share of the items
  int64_t const items = int64_t{params.problem.num_slots} * params.problem.num_qk_heads;
  if (items == 0) return cudaSuccess;
  dim3 const grid(static_cast<unsigned>(std::min<int64_t>(items, sms)));
  intra_bwd_kernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::intra_bwd
