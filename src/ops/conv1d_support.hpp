// What each conv implementation accepts beyond the shared validation (conv1d_validate.hpp), as
// checks that throw cake::Error and as one line for cakeGetBuildInfo. Pure host code, so that a
// build without CUDA knows the CUDA rules too (cakeConv1dCheckSupport).
#pragma once

#include "cake/cake.h"
#include "ops/conv1d_validate.hpp"

namespace cake::ops {

void check_conv1d_reference_forward(cakeConv1dForwardArgs_t const& args, Conv1dDims const& d);
void check_conv1d_reference_backward(cakeConv1dBackwardArgs_t const& args, Conv1dDims const& d);
extern char const* const kConv1dReferenceSupport;

void check_conv1d_cuda_forward(cakeConv1dForwardArgs_t const& args, Conv1dDims const& d);
void check_conv1d_cuda_backward(cakeConv1dBackwardArgs_t const& args, Conv1dDims const& d);
extern char const* const kConv1dCudaSupport;

// The widths the CUDA kernels are compiled for.
inline constexpr int kConv1dCudaMinWidth = 2;
inline constexpr int kConv1dCudaMaxWidth = 4;

}  // namespace cake::ops
