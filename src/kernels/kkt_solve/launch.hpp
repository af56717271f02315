#pragma once

#include <cuda_runtime_api.h>

#include "kernels/kkt_solve/params.hpp"

namespace cake::kernels::kkt_solve {
cudaError_t launch(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::kkt_solve
