#include "ops/dispatch.hpp"

#include <iterator>

#include "core/error.hpp"
#include "ops/activations_cuda.hpp"
#include "ops/reference.hpp"
#include "ops/support.hpp"

namespace cake::ops {

namespace {

size_t no_bytes(cakeOptions_t const&, cakeTensor_t const&, cakeTensor_t const&,
                cakeTensor_t const&) {
  return 0;
}

// The FP64 reference computes in host memory of its own and always recomputes: no workspace, no
// saved set.
Implementation reference_row(cakeVariant_t variant) {
  return {
      cakeCPU,
      variant,
      kReferenceSupport,
      check_reference_forward,
      check_reference_backward,
      no_bytes,
      [](cakeOptions_t const&, cakeForwardArgs_t const&) -> size_t { return 0; },
      [](cakeOptions_t const&, cakeBackwardArgs_t const&) -> size_t { return 0; },
      [](cakeOptions_t const& o, cakeForwardArgs_t const& a, Dims const& d, void*, void*, size_t,
         void*) { reference_forward(o, a, d); },
      [](cakeOptions_t const& o, cakeBackwardArgs_t const& a, Dims const& d, void const*, void*,
         size_t, void*) { reference_backward(o, a, d); },
  };
}

Implementation const kTable[] = {
    reference_row(cakeGdn),
    reference_row(cakeKda),
    {
        cakeCUDA,
        cakeGdn,
        kGdnCudaSupport,
        check_cuda_forward,
        check_cuda_backward,
        cuda_saved_bytes,
        cuda_forward_workspace_bytes,
        cuda_backward_workspace_bytes,
        [](cakeOptions_t const& o, cakeForwardArgs_t const& a, Dims const&, void* saved, void* ws,
           size_t ws_bytes, void* stream) { cuda_forward(o, a, saved, ws, ws_bytes, stream); },
        [](cakeOptions_t const& o, cakeBackwardArgs_t const& a, Dims const&, void const* saved,
           void* ws, size_t ws_bytes,
           void* stream) { cuda_backward(o, a, saved, ws, ws_bytes, stream); },
    },
    {
        cakeCUDA,
        cakeKda,
        kKdaCudaSupport,
        check_cuda_forward,
        check_cuda_backward,
        cuda_saved_bytes,
        cuda_forward_workspace_bytes,
        cuda_backward_workspace_bytes,
        [](cakeOptions_t const& o, cakeForwardArgs_t const& a, Dims const&, void* saved, void* ws,
           size_t ws_bytes, void* stream) { cuda_forward(o, a, saved, ws, ws_bytes, stream); },
        [](cakeOptions_t const& o, cakeBackwardArgs_t const& a, Dims const&, void const* saved,
           void* ws, size_t ws_bytes,
           void* stream) { cuda_backward(o, a, saved, ws, ws_bytes, stream); },
    },
};

}  // namespace

char const* op_name(cakeVariant_t variant) {
  return variant == cakeKda ? "chunk_kda" : "chunk_gated_delta_rule";
}

Implementation const& implementation_for(int32_t device_type, cakeVariant_t variant) {
  for (Implementation const& row : kTable) {
    if (row.device_type == device_type && row.variant == variant) return row;
  }
  // Validation admits only the CPU and CUDA, and the CPU reference runs every variant.
  throw Error(cakeNotImplemented, concat(op_name(variant),
                                         " has no CUDA kernels yet; pass CPU "
                                         "tensors to run the FP64 reference"));
}

Implementation const* implementations_begin() { return std::begin(kTable); }
Implementation const* implementations_end() { return std::end(kTable); }

}  // namespace cake::ops
