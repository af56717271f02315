#pragma once

#include <cuda_runtime_api.h>

#include "kernels/dqk_bwd/params.hpp"

namespace cake::kernels::dqk_bwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::dqk_bwd
