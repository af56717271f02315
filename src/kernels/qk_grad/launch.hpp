#pragma once

#include <cuda_runtime_api.h>

#include "kernels/qk_grad/params.hpp"

namespace cake::kernels::qk_grad {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::qk_grad
