#pragma once

#include <cuda_runtime_api.h>

#include "kernels/intra_bwd/params.hpp"

namespace cake::kernels::intra_bwd {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::intra_bwd
