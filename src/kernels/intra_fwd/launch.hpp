#pragma once

#include <cuda_runtime_api.h>

#include "kernels/intra_fwd/params.hpp"

namespace cake::kernels::intra_fwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::intra_fwd
