// What each norm implementation accepts beyond the shared validation (norm_validate.hpp), as
// checks that throw cake::Error and as one line for cakeGetBuildInfo. Pure host code, so that a
// build without CUDA knows the CUDA rules too (cakeRmsNormCheckSupport).
#pragma once

#include "cake/cake.h"
#include "ops/norm_validate.hpp"

namespace cake::ops {

void check_norm_reference_forward(cakeRmsNormForwardArgs_t const& args, NormDims const& d);
void check_norm_reference_backward(cakeRmsNormBackwardArgs_t const& args, NormDims const& d);
extern char const* const kNormReferenceSupport;

void check_norm_cuda_forward(cakeRmsNormForwardArgs_t const& args, NormDims const& d);
void check_norm_cuda_backward(cakeRmsNormBackwardArgs_t const& args, NormDims const& d);
extern char const* const kNormCudaSupport;

// The rows the CUDA kernels are compiled for: N a multiple of 8 (whole 16-byte vectors of every
// dtype) and at most 1024.
inline constexpr int kNormCudaDimMultiple = 8;
inline constexpr int kNormCudaMaxDim = 1024;

}  // namespace cake::ops
