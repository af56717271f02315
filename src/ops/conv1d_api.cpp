// The conv's C entry points: validate once, then run the implementation that the conv's dispatch
// table holds for the call's device, after its own support check.
#include "cake/cake.h"
#include "core/error.hpp"
#include "ops/conv1d_dispatch.hpp"
#include "ops/conv1d_validate.hpp"

using cake::guard;
using cake::ops::Conv1dDims;
using cake::ops::Conv1dImplementation;

namespace {

Conv1dImplementation const& checked_forward(cakeConv1dForwardArgs_t const* args, Conv1dDims* d) {
  *d = cake::ops::validate_conv1d_forward(args);
  Conv1dImplementation const& impl = cake::ops::conv1d_implementation_for(d->device_type);
  impl.check_forward(*args, *d);
  return impl;
}

Conv1dImplementation const& checked_backward(cakeConv1dBackwardArgs_t const* args, Conv1dDims* d) {
  *d = cake::ops::validate_conv1d_backward(args);
  Conv1dImplementation const& impl = cake::ops::conv1d_implementation_for(d->device_type);
  impl.check_backward(*args, *d);
  return impl;
}

void check_workspace(void const* workspace, size_t workspace_bytes, size_t expected) {
  CAKE_CHECK(workspace != nullptr || workspace_bytes == 0, cakeInvalidArgument,
             "workspace is NULL but workspace_bytes = ", workspace_bytes);
  CAKE_CHECK(workspace_bytes >= expected, cakeInsufficientWorkspace,
             "workspace: expected at least ", expected,
             " bytes (the conv's workspace size query), got ", workspace_bytes);
}

}  // namespace

extern "C" {

cakeResult_t cakeConv1dForwardWorkspaceSize(cakeConv1dForwardArgs_t const* args, size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    Conv1dDims d;
    *bytes = checked_forward(args, &d).forward_workspace_bytes(*args, d);
  });
}

cakeResult_t cakeConv1dBackwardWorkspaceSize(cakeConv1dBackwardArgs_t const* args, size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    Conv1dDims d;
    *bytes = checked_backward(args, &d).backward_workspace_bytes(*args, d);
  });
}

cakeResult_t cakeConv1dCheckSupport(cakeConv1dForwardArgs_t const* args, int32_t device_type) {
  return guard([&] {
    Conv1dDims d = cake::ops::validate_conv1d_forward(args);
    d.device_type = device_type;
    cake::ops::conv1d_implementation_for(device_type).check_forward(*args, d);
  });
}

cakeResult_t cakeConv1dForward(cakeConv1dForwardArgs_t const* args, void* workspace,
                               size_t workspace_bytes, void* stream) {
  return guard([&] {
    Conv1dDims d;
    Conv1dImplementation const& impl = checked_forward(args, &d);
    check_workspace(workspace, workspace_bytes, impl.forward_workspace_bytes(*args, d));
    cake::ops::check_conv1d_forward_apart(*args);
    impl.forward(*args, d, workspace, workspace_bytes, stream);
  });
}

cakeResult_t cakeConv1dBackward(cakeConv1dBackwardArgs_t const* args, void* workspace,
                                size_t workspace_bytes, void* stream) {
  return guard([&] {
    Conv1dDims d;
    Conv1dImplementation const& impl = checked_backward(args, &d);
    check_workspace(workspace, workspace_bytes, impl.backward_workspace_bytes(*args, d));
    cake::ops::check_conv1d_backward_apart(*args);
    impl.backward(*args, d, workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
