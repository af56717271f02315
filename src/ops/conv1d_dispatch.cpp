#include "ops/conv1d_dispatch.hpp"

#include <iterator>

#include "core/error.hpp"
#include "ops/conv1d_cuda.hpp"
#include "ops/conv1d_reference.hpp"
#include "ops/conv1d_support.hpp"

namespace cake::ops {

namespace {

Conv1dImplementation const kTable[] = {
    // The FP64 reference computes in host memory of its own: no workspace.
    {
        cakeCPU,
        kConv1dReferenceSupport,
        check_conv1d_reference_forward,
        check_conv1d_reference_backward,
        [](cakeConv1dForwardArgs_t const&, Conv1dDims const&) -> size_t { return 0; },
        [](cakeConv1dBackwardArgs_t const&, Conv1dDims const&) -> size_t { return 0; },
        [](cakeConv1dForwardArgs_t const& a, Conv1dDims const& d, void*, size_t, void*) {
          conv1d_reference_forward(a, d);
        },
        [](cakeConv1dBackwardArgs_t const& a, Conv1dDims const& d, void*, size_t, void*) {
          conv1d_reference_backward(a, d);
        },
    },
    {
        cakeCUDA,
        kConv1dCudaSupport,
        check_conv1d_cuda_forward,
        check_conv1d_cuda_backward,
        conv1d_cuda_forward_workspace_bytes,
        conv1d_cuda_backward_workspace_bytes,
        conv1d_cuda_forward,
        conv1d_cuda_backward,
    },
};

}  // namespace

Conv1dImplementation const& conv1d_implementation_for(int32_t device_type) {
  for (Conv1dImplementation const& row : kTable) {
    if (row.device_type == device_type) return row;
  }
  // Validation admits only the CPU and CUDA, and both have a row.
  throw Error(cakeInternalError,
              concat("no causal_conv1d implementation for device type ", device_type));
}

Conv1dImplementation const* conv1d_implementations_begin() { return std::begin(kTable); }
Conv1dImplementation const* conv1d_implementations_end() { return std::end(kTable); }

}  // namespace cake::ops
