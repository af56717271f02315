// The conv's GPU path as the C entry points see it (conv1d_dispatch.cpp runs these for CUDA
// tensors after conv1d_validate.hpp and conv1d_support.hpp have checked every argument).
// Implemented in src/ops/cuda/conv1d_cuda.cpp when the kernels are built; otherwise
// src/ops/no_cuda/conv1d_cuda.cpp raises cakeNotImplemented.
#pragma once

#include <cstddef>

#include "cake/cake.h"
#include "ops/conv1d_validate.hpp"

namespace cake::ops {

size_t conv1d_cuda_forward_workspace_bytes(cakeConv1dForwardArgs_t const& args,
                                           Conv1dDims const& d);
size_t conv1d_cuda_backward_workspace_bytes(cakeConv1dBackwardArgs_t const& args,
                                            Conv1dDims const& d);
void conv1d_cuda_forward(cakeConv1dForwardArgs_t const& args, Conv1dDims const& d, void* workspace,
                         size_t workspace_bytes, void* stream);
void conv1d_cuda_backward(cakeConv1dBackwardArgs_t const& args, Conv1dDims const& d,
                          void* workspace, size_t workspace_bytes, void* stream);

}  // namespace cake::ops
