#pragma once

#include <cuda_runtime_api.h>

#include "kernels/conv1d_bwd/params.hpp"

namespace cake::kernels::conv1d_bwd {
// dx, dresidual and the tiles' partial sums; dinitial_state; then dweight and dbias from the
// partial sums. No host synchronisation.
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::conv1d_bwd
