#include "kernels/walk_a_bwd/kernel.cuh"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_bwd/maps.hpp"

namespace cake::kernels::walk_a_bwd {

template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream) {
  // ChannelDecay keeps kbar where eO's low part would go (kernel.cuh)
  if (Decay::kGatedKkt && params.eo_split) return cudaErrorInvalidValue;
  KernelParams kp{params, {}, {}, {}, {}, {}, {}, {}, {}};
  if (cudaError_t const err = encode_maps<Decay>(kp); err != cudaSuccess) return err;
  int const smem = sizeof(SharedStorage<Decay>);
  cudaError_t err = cudaFuncSetAttribute(walk_a_bwd_kernel<Decay>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // 1-D: walk_of_block maps each block to its (document, value head), longest documents first
  dim3 const grid(
      static_cast<unsigned>(int64_t{params.problem.num_seqs} * params.problem.num_v_heads));
  // With the h-walk's flags, a programmatic dependent of the h-walk launched just before: its
  // blocks start on the SMs the h-walk's last blocks leave idle, each once its own h is stored
  // (kernel.cuh waits on the flag). Where the stream cannot overlap them it runs after the h-walk,
  // as an ordinary launch would.
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  cudaLaunchAttribute overlap = {};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  if (params.h_ready != nullptr) {
    config.attrs = &overlap;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, walk_a_bwd_kernel<Decay>, kp);
}

template cudaError_t launch<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch<ChannelDecay>(Params const&, cudaStream_t);

}  // namespace cake::kernels::walk_a_bwd
