#pragma once

#include <cuda_runtime_api.h>

#include "kernels/output_fwd/params.hpp"

namespace cake::kernels::output_fwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::output_fwd
