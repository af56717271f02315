// What each implementation accepts beyond the shared validation (validate.hpp), as checks that
// throw cake::Error, and as one line for cakeGetBuildInfo. The CPU reference takes any float dtype
// and head dims 1..256; the CUDA kernels (GDN and KDA) take bf16 q/k/v/o, fp32 g, fp32 or bf16
// beta, fp32 states, K = V = 128 and contiguous tensors (but q and k where GDN's backward reads
// none of their elements: cuda_backward_reads_qk). Pure host code: a build without CUDA knows the
// CUDA rules too, so that a CPU call can say whether CUDA would run it (cakeCheckSupport).
#pragma once

#include "cake/cake.h"
#include "ops/validate.hpp"

namespace cake::ops {

void check_reference_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args,
                             Dims const& d);
void check_reference_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                              Dims const& d);
extern char const* const kReferenceSupport;

// The CUDA kernels' rules, the same for GDN and KDA (the shared validation checks g's shape) but
// for the q/k strides of GDN's backward (cuda_backward_reads_qk).
void check_cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, Dims const& d);
void check_cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                         Dims const& d);
extern char const* const kGdnCudaSupport;
extern char const* const kKdaCudaSupport;

// Whether the backward on CUDA reads q's and k's elements: not GDN's with use_qk_l2norm in saved
// and inverse modes, whose saved set holds q̂, k̂ and their rows' rstd (validated options). KDA's
// backward keeps q, k checked in every mode: it reruns qk_norm but in saved mode, and its intra
// pass reads q, k themselves without the norm.
bool cuda_backward_reads_qk(cakeOptions_t const& options);

}  // namespace cake::ops
