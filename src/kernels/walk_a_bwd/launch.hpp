#pragma once

#include <cuda_runtime_api.h>

#include "kernels/walk_a_bwd/params.hpp"

namespace cake::kernels::walk_a_bwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::walk_a_bwd
