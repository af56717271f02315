// The C entry points: validate once, then run the CPU reference or the CUDA path.
#include "cake/cake.h"
#include "core/error.hpp"
#include "ops/gdn_cuda.hpp"
#include "ops/reference.hpp"
#include "ops/validate.hpp"

using cake::guard;
using cake::ops::Dims;

extern "C" {

cakeResult_t cakeForwardWorkspaceSize(cakeOptions_t const* options, cakeForwardArgs_t const* args,
                                      size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    Dims const d = cake::ops::validate_forward(options, args);
    *bytes = d.device_type == cakeCPU ? 0
                                      : cake::ops::gdn_cuda_forward_workspace_bytes(*options, *args);
  });
}

cakeResult_t cakeBackwardWorkspaceSize(cakeOptions_t const* options,
                                       cakeBackwardArgs_t const* args, size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    Dims const d = cake::ops::validate_backward(options, args);
    *bytes = d.device_type == cakeCPU
                 ? 0
                 : cake::ops::gdn_cuda_backward_workspace_bytes(*options, *args);
  });
}

cakeResult_t cakeForward(cakeOptions_t const* options, cakeForwardArgs_t const* args,
                         void* workspace, size_t workspace_bytes, void* stream) {
  return guard([&] {
    Dims const d = cake::ops::validate_forward(options, args);
    if (d.device_type == cakeCPU) {
      cake::ops::reference_forward(*options, *args, d);
    } else {
      cake::ops::gdn_cuda_forward(*options, *args, workspace, workspace_bytes, stream);
    }
  });
}

cakeResult_t cakeBackward(cakeOptions_t const* options, cakeBackwardArgs_t const* args,
                          void* workspace, size_t workspace_bytes, void* stream) {
  return guard([&] {
    Dims const d = cake::ops::validate_backward(options, args);
    if (d.device_type == cakeCPU) {
      cake::ops::reference_backward(*options, *args, d);
    } else {
      cake::ops::gdn_cuda_backward(*options, *args, workspace, workspace_bytes, stream);
    }
  });
}

}  // extern "C"
