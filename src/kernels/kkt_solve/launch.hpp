#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/decay.hpp"
#include "kernels/kkt_solve/params.hpp"

namespace cake::kernels::kkt_solve {
// Decay: ScalarDecay (GDN) or ChannelDecay (KDA), common/decay.hpp.
template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::kkt_solve
