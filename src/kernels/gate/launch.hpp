#pragma once

#include <cuda_runtime_api.h>

#include "kernels/gate/params.hpp"

namespace cake::kernels::gate {
// g and beta activated (as activate_g and activate_beta say).
cudaError_t launch_forward(Params const& params, cudaStream_t stream);
// dg_raw, dA_log, ddt_bias and dbeta_raw (where set).
cudaError_t launch_backward(Params const& params, cudaStream_t stream);
}  // namespace cake::kernels::gate
