#include "kernels/intra_bwd/kernel.cuh"
#include "kernels/intra_bwd/launch.hpp"

namespace cake::kernels::intra_bwd {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int const smem = sizeof(SharedStorage);
  cudaError_t err =
      cudaFuncSetAttribute(intra_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  int device = 0, sms = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess)
    return err;
  Params p = params;
  p.prefetch_ahead = sms;  // one CTA per SM (SharedStorage)
  dim3 const grid(static_cast<unsigned>(params.problem.num_slots),
                  static_cast<unsigned>(params.problem.num_qk_heads));
  intra_bwd_kernel<<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cake::kernels::intra_bwd
