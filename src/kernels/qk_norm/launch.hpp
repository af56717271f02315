#pragma once

#include <cuda_runtime_api.h>

#include "kernels/qk_norm/params.hpp"

namespace cake::kernels::qk_norm {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::qk_norm
