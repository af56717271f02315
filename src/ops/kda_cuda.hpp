// The KDA GPU path as the C entry points see it (the dispatch table of dispatch.cpp runs these for
// CUDA tensors and variant cakeKda, after validate.hpp and support.hpp have checked every
// argument, the saved buffer's size included), with the same contract as gdn_cuda.hpp.
// Implemented in src/ops/cuda when the kernels are built; otherwise src/ops/no_cuda/unavailable.cpp
// raises cakeNotImplemented.
#pragma once

#include <cstddef>

#include "cake/cake.h"

namespace cake::ops {

// The bytes of the saved set (0 but in saved mode), from the shapes of q [B, T, H, K],
// v [B, T, HV, V] and cu_seqlens [N + 1]: the same for a forward and its backward.
size_t kda_cuda_saved_bytes(cakeOptions_t const& options, cakeTensor_t const& q,
                            cakeTensor_t const& v, cakeTensor_t const& cu_seqlens);

size_t kda_cuda_forward_workspace_bytes(cakeOptions_t const& options,
                                        cakeForwardArgs_t const& args);
// saved: the saved set to write in saved mode (else nullptr).
void kda_cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, void* saved,
                      void* workspace, size_t workspace_bytes, void* stream);

size_t kda_cuda_backward_workspace_bytes(cakeOptions_t const& options,
                                         cakeBackwardArgs_t const& args);
// saved: the forward's saved set in saved mode, read only (else nullptr).
void kda_cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                       void const* saved, void* workspace, size_t workspace_bytes, void* stream);

}  // namespace cake::ops
