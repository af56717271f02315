#include "kernels/common/device_sms.hpp"
#include "kernels/kkt_solve/kernel.cuh"
#include "kernels/kkt_solve/launch.hpp"

namespace cake::kernels::kkt_solve {

template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream) {
  if (!params_valid<Decay>(params)) return cudaErrorInvalidValue;
  int const smem = sizeof(SharedStorage<Decay>);
  cudaError_t err = cudaFuncSetAttribute(kkt_solve_kernel<Decay>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  dim3 grid(static_cast<unsigned>(params.problem.num_slots),
            static_cast<unsigned>(params.problem.num_qk_heads));
  if constexpr (Decay::kGatedKkt) {
    // The CTAs resident at once on the current device (host queries: no sync), for the
    // persistent CTAs
    int num_sms = 0;
    int per_sm = 0;
    if (err = current_sm_count(&num_sms); err != cudaSuccess) return err;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kkt_solve_kernel<Decay>, kThreads,
                                                        smem);
    if (err != cudaSuccess) return err;
    if (per_sm == 0) return cudaErrorInvalidConfiguration;
    grid =
        dim3(static_cast<unsigned>(channel_decay_ctas(params.problem, int64_t{per_sm} * num_sms)));
    if (grid.x == 0) return cudaSuccess;
  }
  kkt_solve_kernel<Decay><<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

template cudaError_t launch<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch<ChannelDecay>(Params const&, cudaStream_t);

}  // namespace cake::kernels::kkt_solve
