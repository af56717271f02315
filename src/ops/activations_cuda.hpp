// Either op's GPU path as the dispatch table runs it (CUDA rows of dispatch.cpp): the in-op
// activations of g and beta (use_gate_in_kernel, use_beta_sigmoid_in_kernel; src/kernels/gate)
// around the delta rule's GPU path of options.variant (gdn_cuda.hpp, kda_cuda.hpp), with the same
// contract as those. Without either option it is that path, bytes and all. Implemented in
// src/ops/cuda when the kernels are built; otherwise src/ops/no_cuda/unavailable.cpp raises
// cakeNotImplemented.
#pragma once

#include <cstddef>

#include "cake/cake.h"

namespace cake::ops {

// How this library's CUDA path was built.
struct CudaBuild {
  bool kernels;               // the sm_90a kernels are compiled in
  char const* architectures;  // "sm_90a", or "" without them
  int runtime_version;        // CUDART_VERSION compiled against (13000 for 13.0), or 0
};
CudaBuild cuda_build();

size_t cuda_saved_bytes(cakeOptions_t const& options, cakeTensor_t const& q, cakeTensor_t const& v,
                        cakeTensor_t const& cu_seqlens);

size_t cuda_forward_workspace_bytes(cakeOptions_t const& options, cakeForwardArgs_t const& args);
void cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, void* saved,
                  void* workspace, size_t workspace_bytes, void* stream);

size_t cuda_backward_workspace_bytes(cakeOptions_t const& options, cakeBackwardArgs_t const& args);
void cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args, void const* saved,
                   void* workspace, size_t workspace_bytes, void* stream);

}  // namespace cake::ops
