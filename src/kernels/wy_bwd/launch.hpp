#pragma once

#include <cuda_runtime_api.h>

#include "kernels/wy_bwd/params.hpp"

namespace cake::kernels::wy_bwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::wy_bwd
