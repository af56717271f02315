#include "ops/norm_dispatch.hpp"

#include <iterator>

#include "core/error.hpp"
#include "ops/norm_cuda.hpp"
#include "ops/norm_reference.hpp"
#include "ops/norm_support.hpp"

namespace cake::ops {

namespace {

NormImplementation const kTable[] = {
    // The FP64 reference computes in host memory of its own: no workspace.
    {
        cakeCPU,
        kNormReferenceSupport,
        check_norm_reference_forward,
        check_norm_reference_backward,
        [](cakeRmsNormBackwardArgs_t const&, NormDims const&) -> size_t { return 0; },
        [](cakeRmsNormForwardArgs_t const& a, NormDims const& d, void*) {
          norm_reference_forward(a, d);
        },
        [](cakeRmsNormBackwardArgs_t const& a, NormDims const& d, void*, size_t, void*) {
          norm_reference_backward(a, d);
        },
    },
    {
        cakeCUDA,
        kNormCudaSupport,
        check_norm_cuda_forward,
        check_norm_cuda_backward,
        norm_cuda_backward_workspace_bytes,
        norm_cuda_forward,
        norm_cuda_backward,
    },
};

}  // namespace

NormImplementation const& norm_implementation_for(int32_t device_type) {
  for (NormImplementation const& row : kTable) {
    if (row.device_type == device_type) return row;
  }
  // Validation admits only the CPU and CUDA, and both have a row.
  throw Error(cakeInternalError,
              concat("no rms_norm_gated implementation for device type ", device_type));
}

NormImplementation const* norm_implementations_begin() { return std::begin(kTable); }
NormImplementation const* norm_implementations_end() { return std::end(kTable); }

}  // namespace cake::ops
