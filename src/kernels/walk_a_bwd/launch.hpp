#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/decay.hpp"
#include "kernels/walk_a_bwd/params.hpp"

namespace cake::kernels::walk_a_bwd {
// Decay: ScalarDecay (GDN) or ChannelDecay (KDA), common/decay.hpp.
// The walk (one CTA per document and value head), or with params.ds_end the chunk pass of the
// split form (one per chunk and value head; params.dh0 must be nullptr: the dS-walk forms dh0).
template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream);
// The dS-walk of the split form: dS of each chunk's end -> params.ds_end_out, and dh0; it reads
// neither V nor h and sets no other output, so it takes no ticket (params.order must be nullptr).
// Where twice the walks fit the device's SMs (walk_a_fwd/split.hpp's rule) each walk runs as two
// CTAs of 64 of dS's columns. With params.h_ready it is launched as the h-walk's programmatic
// dependent, so that the two walks run side by side.
template <class Decay>
cudaError_t launch_ds_walk(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::walk_a_bwd
