// The norm's C entry points: validate once, then run the implementation that the norm's dispatch
// table holds for the call's device, after its own support check.
#include "cake/cake.h"
#include "core/error.hpp"
#include "ops/norm_dispatch.hpp"
#include "ops/norm_validate.hpp"

using cake::guard;
using cake::ops::NormDims;
using cake::ops::NormImplementation;

namespace {

NormImplementation const& checked_forward(cakeRmsNormForwardArgs_t const* args, NormDims* d) {
  *d = cake::ops::validate_norm_forward(args);
  NormImplementation const& impl = cake::ops::norm_implementation_for(d->device_type);
  impl.check_forward(*args, *d);
  return impl;
}

NormImplementation const& checked_backward(cakeRmsNormBackwardArgs_t const* args, NormDims* d) {
  *d = cake::ops::validate_norm_backward(args);
  NormImplementation const& impl = cake::ops::norm_implementation_for(d->device_type);
  impl.check_backward(*args, *d);
  return impl;
}

}  // namespace

extern "C" {

cakeResult_t cakeRmsNormBackwardWorkspaceSize(cakeRmsNormBackwardArgs_t const* args,
                                              size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    NormDims d;
    *bytes = checked_backward(args, &d).backward_workspace_bytes(*args, d);
  });
}

cakeResult_t cakeRmsNormCheckSupport(cakeRmsNormForwardArgs_t const* args, int32_t device_type) {
  return guard([&] {
    NormDims d = cake::ops::validate_norm_forward(args);
    d.device_type = device_type;
    cake::ops::norm_implementation_for(device_type).check_forward(*args, d);
  });
}

cakeResult_t cakeRmsNormForward(cakeRmsNormForwardArgs_t const* args, void* stream) {
  return guard([&] {
    NormDims d;
    NormImplementation const& impl = checked_forward(args, &d);
    cake::ops::check_norm_forward_apart(*args);
    impl.forward(*args, d, stream);
  });
}

cakeResult_t cakeRmsNormBackward(cakeRmsNormBackwardArgs_t const* args, void* workspace,
                                 size_t workspace_bytes, void* stream) {
  return guard([&] {
    NormDims d;
    NormImplementation const& impl = checked_backward(args, &d);
    size_t const expected = impl.backward_workspace_bytes(*args, d);
    CAKE_CHECK(workspace != nullptr || workspace_bytes == 0, cakeInvalidArgument,
               "workspace is NULL but workspace_bytes = ", workspace_bytes);
    CAKE_CHECK(workspace_bytes >= expected, cakeInsufficientWorkspace,
               "workspace: expected at least ", expected,
               " bytes (cakeRmsNormBackwardWorkspaceSize), got ", workspace_bytes);
    cake::ops::check_norm_backward_apart(*args);
    impl.backward(*args, d, workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
