// The C entry points: validate once, then run the implementation that the dispatch table holds
// for the call's device and variant.
#include "cake/cake.h"
#include "core/error.hpp"
#include "ops/dispatch.hpp"
#include "ops/validate.hpp"

using cake::guard;
using cake::ops::Dims;
using cake::ops::Implementation;

namespace {

// The validated call's implementation, after its own support check.
Implementation const& checked_forward(cakeOptions_t const* options, cakeForwardArgs_t const* args,
                                      Dims* d) {
  *d = cake::ops::validate_forward(options, args);
  Implementation const& impl = cake::ops::implementation_for(d->device_type, options->variant);
  impl.check_forward(*options, *args, *d);
  return impl;
}

Implementation const& checked_backward(cakeOptions_t const* options, cakeBackwardArgs_t const* args,
                                       Dims* d) {
  *d = cake::ops::validate_backward(options, args);
  Implementation const& impl = cake::ops::implementation_for(d->device_type, options->variant);
  impl.check_backward(*options, *args, *d);
  return impl;
}

}  // namespace

extern "C" {

cakeResult_t cakeForwardWorkspaceSize(cakeOptions_t const* options, cakeForwardArgs_t const* args,
                                      size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    Dims d;
    *bytes = checked_forward(options, args, &d).forward_workspace_bytes(*options, *args);
  });
}

cakeResult_t cakeBackwardWorkspaceSize(cakeOptions_t const* options, cakeBackwardArgs_t const* args,
                                       size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    Dims d;
    *bytes = checked_backward(options, args, &d).backward_workspace_bytes(*options, *args);
  });
}

cakeResult_t cakeForwardSavedSize(cakeOptions_t const* options, cakeForwardArgs_t const* args,
                                  size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    Dims d;
    *bytes = checked_forward(options, args, &d)
                 .saved_bytes(*options, args->q, args->v, args->cu_seqlens);
  });
}

cakeResult_t cakeCheckSupport(cakeOptions_t const* options, cakeForwardArgs_t const* args,
                              int32_t device_type) {
  return guard([&] {
    Dims d = cake::ops::validate_forward(options, args);
    d.device_type = device_type;
    cake::ops::implementation_for(device_type, options->variant).check_forward(*options, *args, d);
  });
}

cakeResult_t cakeForward(cakeOptions_t const* options, cakeForwardArgs_t const* args, void* saved,
                         size_t saved_bytes, void* workspace, size_t workspace_bytes,
                         void* stream) {
  return guard([&] {
    Dims d;
    Implementation const& impl = checked_forward(options, args, &d);
    cake::ops::validate_saved(*options, saved, saved_bytes,
                              impl.saved_bytes(*options, args->q, args->v, args->cu_seqlens));
    cake::ops::check_forward_apart(*args);
    impl.forward(*options, *args, d, saved, workspace, workspace_bytes, stream);
  });
}

cakeResult_t cakeBackward(cakeOptions_t const* options, cakeBackwardArgs_t const* args,
                          void const* saved, size_t saved_bytes, void* workspace,
                          size_t workspace_bytes, void* stream) {
  return guard([&] {
    Dims d;
    Implementation const& impl = checked_backward(options, args, &d);
    cake::ops::validate_saved(*options, saved, saved_bytes,
                              impl.saved_bytes(*options, args->q, args->v, args->cu_seqlens));
    cake::ops::check_backward_apart(*args);
    impl.backward(*options, *args, d, saved, workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
