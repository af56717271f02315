#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/decay.hpp"
#include "kernels/walk_a_bwd/params.hpp"

namespace cake::kernels::walk_a_bwd {
// Decay: ScalarDecay (GDN) or ChannelDecay (KDA), common/decay.hpp.
template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::walk_a_bwd
