#pragma once

#include <cuda_runtime_api.h>

#include "kernels/state_fwd/params.hpp"

namespace cake::kernels::state_fwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::state_fwd
