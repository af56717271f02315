#pragma once

#include <cuda_runtime_api.h>

#include "kernels/conv1d_fwd/params.hpp"

namespace cake::kernels::conv1d_fwd {
// y, then final_state when wanted; no host synchronisation.
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::conv1d_fwd
