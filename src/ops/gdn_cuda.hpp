// The GDN GPU path as the C entry points see it (the dispatch table of dispatch.cpp runs these for
// CUDA tensors and variant cakeGdn, after validate.hpp and support.hpp have checked every
// argument, the saved buffer's size included). Implemented in src/ops/cuda when the kernels are
// built; otherwise src/ops/no_cuda/unavailable.cpp raises cakeNotImplemented.
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
