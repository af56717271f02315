#include "kernels/common/device_sms.hpp"
#include "kernels/walk_a_bwd/kernel.cuh"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_bwd/maps.hpp"
#include "kernels/walk_a_fwd/split.hpp"

namespace cake::kernels::walk_a_bwd {

namespace {

// One form's launch on a 1-D grid of `blocks` CTAs; `beside` makes it a programmatic dependent of
// the kernel launched just before (the h-walk): its blocks start on the SMs the h-walk's last
// blocks leave idle. Where the stream cannot overlap them it runs after the h-walk, as an ordinary
// launch would.
template <class Decay, Form kForm, int kSlices>
cudaError_t launch_form(Params const& params, int64_t blocks, bool beside, cudaStream_t stream) {
  // ChannelDecay keeps kbar where eO's low part would go (kernel.cuh)
  if (Decay::kGatedKkt && params.eo_split) return cudaErrorInvalidValue;
  KernelParams kp{params, {}, {}, {}, {}, {}, {}, {}, {}};
  if (cudaError_t const err = encode_maps<Decay, kForm == Form::kDsWalk>(kp); err != cudaSuccess)
    return err;
  int const smem = sizeof(SharedStorage<Decay>);
  cudaError_t err = cudaFuncSetAttribute(walk_a_bwd_kernel<Decay, kForm, kSlices>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  cudaLaunchAttribute overlap = {};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  if (beside) {
    config.attrs = &overlap;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, walk_a_bwd_kernel<Decay, kForm, kSlices>, kp);
}

}  // namespace

template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream) {
  Problem const& pr = params.problem;
  if (params.ds_end_out != nullptr) return cudaErrorInvalidValue;  // the dS-walk's
  if (params.ds_end == nullptr)  // the walk: walk_of_block maps each block to its (document,
                                 // value head), longest documents first
    return launch_form<Decay, Form::kWalk, 1>(params, int64_t{pr.num_seqs} * pr.num_v_heads,
                                              params.h_ready != nullptr, stream);
  // the chunk pass: after the dS-walk (in stream order: it reads all of ds_end), each CTA waiting
  // on its walk's h flag where the h-walk runs beside the dS-walk
  if (params.dh0 != nullptr) return cudaErrorInvalidValue;
  return launch_form<Decay, Form::kChunkPass, 1>(params, pr.num_slots * pr.num_v_heads, false,
                                                 stream);
}

template <class Decay>
cudaError_t launch_ds_walk(Params const& params, cudaStream_t stream) {
  Problem const& pr = params.problem;
  // (no tickets: it writes no dq or dk, so the chunk pass after it takes them all)
  if (params.ds_end_out == nullptr || params.ds_end != nullptr || params.order != nullptr)
    return cudaErrorInvalidValue;
  // Split by dS's columns on the forward walk's rule (walk_a_fwd/split.hpp: all walks where twice
  // their number fits the SMs of the current device, an attribute: no sync), for its reason: the
  // step is a chain of products on the columns, at N = 32 a warpgroup in place of 64, on SMs that
  // were idle. A walk's two CTAs (blocks 2w, 2w + 1) each store their 64 columns of ds_end and dh0.
  int num_sms = 0;
  if (cudaError_t const err = current_sm_count(&num_sms); err != cudaSuccess) return err;
  int64_t const num_walks = int64_t{pr.num_seqs} * pr.num_v_heads;
  bool const beside = params.h_ready != nullptr;
  if (walk_a_fwd::split_walks(num_walks, num_sms))
    return launch_form<Decay, Form::kDsWalk, kSlicesOfH>(params, num_walks * kSlicesOfH, beside,
                                                         stream);
  return launch_form<Decay, Form::kDsWalk, 1>(params, num_walks, beside, stream);
}

template cudaError_t launch<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch<ChannelDecay>(Params const&, cudaStream_t);
template cudaError_t launch_ds_walk<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch_ds_walk<ChannelDecay>(Params const&, cudaStream_t);

}  // namespace cake::kernels::walk_a_bwd
