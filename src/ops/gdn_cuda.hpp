// The GDN GPU path (run for CUDA tensors and variant cakeGdn by activations_cuda.hpp's functions,
// which the dispatch table of dispatch.cpp calls after validate.hpp and support.hpp have checked
// every argument, the saved buffer's size included), with options that ask for no in-op
// activation of g or beta. Built with the kernels only (src/ops/cuda).
#pragma once

#include <cstddef>

#include "cake/cake.h"

namespace cake::ops {

// The bytes of the saved set (0 in recompute mode), from the shapes of q [B, T, H, K],
// v [B, T, HV, V] and cu_seqlens [N + 1]: the same for a forward and its backward.
size_t gdn_cuda_saved_bytes(cakeOptions_t const& options, cakeTensor_t const& q,
                            cakeTensor_t const& v, cakeTensor_t const& cu_seqlens);

size_t gdn_cuda_forward_workspace_bytes(cakeOptions_t const& options,
                                        cakeForwardArgs_t const& args);
// saved: the saved set to write in saved and inverse modes (nullptr in recompute mode).
void gdn_cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, void* saved,
                      void* workspace, size_t workspace_bytes, void* stream);

size_t gdn_cuda_backward_workspace_bytes(cakeOptions_t const& options,
                                         cakeBackwardArgs_t const& args);
// saved: the forward's saved set in saved and inverse modes, read only (nullptr in recompute
// mode).
void gdn_cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                       void const* saved, void* workspace, size_t workspace_bytes, void* stream);

}  // namespace cake::ops
