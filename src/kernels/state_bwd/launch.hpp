#pragma once

#include <cuda_runtime_api.h>

#include "kernels/state_bwd/params.hpp"

namespace cake::kernels::state_bwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::state_bwd
