#pragma once

#include <cuda_runtime_api.h>

#include "kernels/norm_bwd/params.hpp"

namespace cake::kernels::norm_bwd {
// dx, dg and the blocks' partial sums of dweight; then dweight from them. No host
// synchronisation.
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::norm_bwd
