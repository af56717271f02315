// The C entry points: validate once, then run the CPU reference or the CUDA path.
#include "cake/cake.h"
#include "core/error.hpp"
#include "ops/gdn_cuda.hpp"
#include "ops/reference.hpp"
#include "ops/validate.hpp"

using cake::guard;
using cake::ops::Dims;

namespace {

// The saved set's bytes on the call's device: the CPU reference always recomputes.
size_t saved_bytes_for(Dims const& d, cakeOptions_t const& options, cakeTensor_t const& q,
                       cakeTensor_t const& v, cakeTensor_t const& cu_seqlens) {
  return d.device_type == cakeCPU ? 0 : cake::ops::gdn_cuda_saved_bytes(options, q, v, cu_seqlens);
}

}  // namespace

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

cakeResult_t cakeForwardSavedSize(cakeOptions_t const* options, cakeForwardArgs_t const* args,
                                  size_t* bytes) {
  return guard([&] {
    CAKE_CHECK(bytes != nullptr, cakeInvalidArgument, "bytes must not be NULL");
    Dims const d = cake::ops::validate_forward(options, args);
    *bytes = saved_bytes_for(d, *options, args->q, args->v, args->cu_seqlens);
  });
}

cakeResult_t cakeForward(cakeOptions_t const* options, cakeForwardArgs_t const* args, void* saved,
                         size_t saved_bytes, void* workspace, size_t workspace_bytes,
                         void* stream) {
  return guard([&] {
    Dims const d = cake::ops::validate_forward(options, args);
    cake::ops::validate_saved(*options, saved, saved_bytes,
                              saved_bytes_for(d, *options, args->q, args->v, args->cu_seqlens));
    if (d.device_type == cakeCPU) {
      cake::ops::reference_forward(*options, *args, d);
    } else {
      cake::ops::gdn_cuda_forward(*options, *args, saved, workspace, workspace_bytes, stream);
    }
  });
}

cakeResult_t cakeBackward(cakeOptions_t const* options, cakeBackwardArgs_t const* args,
                          void const* saved, size_t saved_bytes, void* workspace,
                          size_t workspace_bytes, void* stream) {
  return guard([&] {
    Dims const d = cake::ops::validate_backward(options, args);
    cake::ops::validate_saved(*options, saved, saved_bytes,
                              saved_bytes_for(d, *options, args->q, args->v, args->cu_seqlens));
    if (d.device_type == cakeCPU) {
      cake::ops::reference_backward(*options, *args, d);
    } else {
      cake::ops::gdn_cuda_backward(*options, *args, saved, workspace, workspace_bytes, stream);
    }
  });
}

}  // extern "C"
