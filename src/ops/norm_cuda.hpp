// The norm's GPU path as the C entry points see it (norm_dispatch.cpp runs these for CUDA tensors
// after norm_validate.hpp and norm_support.hpp have checked every argument). Implemented in
// src/ops/cuda/norm_cuda.cpp when the kernels are built; otherwise src/ops/no_cuda/norm_cuda.cpp
// raises cakeNotImplemented.
#pragma once

#include <cstddef>

#include "cake/cake.h"
#include "ops/norm_validate.hpp"

namespace cake::ops {

size_t norm_cuda_backward_workspace_bytes(cakeRmsNormBackwardArgs_t const& args, NormDims const& d);
void norm_cuda_forward(cakeRmsNormForwardArgs_t const& args, NormDims const& d, void* stream);
void norm_cuda_backward(cakeRmsNormBackwardArgs_t const& args, NormDims const& d, void* workspace,
                        size_t workspace_bytes, void* stream);

}  // namespace cake::ops
