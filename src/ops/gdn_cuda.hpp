// The GDN GPU path as the C entry points see it (src/ops/api.cpp calls these for CUDA tensors and
// variant cakeGdn, after validate.hpp has checked every argument). Implemented in
// src/ops/cuda/gdn_cuda.cpp when CAKE_CUDA=ON; otherwise src/ops/no_cuda/gdn_cuda.cpp raises
// cakeNotImplemented.
#pragma once

#include <cstddef>

#include "cake/cake.h"

namespace cake::ops {

size_t gdn_cuda_forward_workspace_bytes(cakeOptions_t const& options, cakeForwardArgs_t const& args);
void gdn_cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, void* workspace,
                      size_t workspace_bytes, void* stream);

size_t gdn_cuda_backward_workspace_bytes(cakeOptions_t const& options,
                                         cakeBackwardArgs_t const& args);
void gdn_cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                       void* workspace, size_t workspace_bytes, void* stream);

}  // namespace cake::ops
