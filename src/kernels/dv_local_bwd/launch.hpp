#pragma once

#include <cuda_runtime_api.h>

#include "kernels/dv_local_bwd/params.hpp"

namespace cake::kernels::dv_local_bwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::dv_local_bwd
