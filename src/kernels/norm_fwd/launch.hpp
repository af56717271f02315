#pragma once

#include <cuda_runtime_api.h>

#include "kernels/norm_fwd/params.hpp"

namespace cake::kernels::norm_fwd {
// y and rstd; no host synchronisation.
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::norm_fwd
