#include "ops/conv1d_support.hpp"

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "ops/checks.hpp"

namespace cake::ops {

namespace {

void check_width(Conv1dDims const& d) {
  CAKE_CHECK(d.width >= kConv1dCudaMinWidth && d.width <= kConv1dCudaMaxWidth, cakeNotSupported,
             "the CUDA kernels support widths W = ", kConv1dCudaMinWidth, "..", kConv1dCudaMaxWidth,
             ", got weight of shape [D, W] with W = ", d.width);
}

}  // namespace

char const* const kConv1dReferenceSupport =
    "FP64 reference: any float dtype (computed in float64), any width W >= 1, silu or none";

void check_conv1d_reference_forward(cakeConv1dForwardArgs_t const&, Conv1dDims const&) {}
void check_conv1d_reference_backward(cakeConv1dBackwardArgs_t const&, Conv1dDims const&) {}

char const* const kConv1dCudaSupport =
    "sm_90a kernels: bfloat16, float16 or float32 x (residual, y and their gradients in x's "
    "dtype), float32 accumulation; weight, bias and states float32, bfloat16 or float16; widths "
    "W = 2..4; any D; contiguous tensors; int32 or int64 cu_seqlens; silu or none";

void check_conv1d_cuda_forward(cakeConv1dForwardArgs_t const& a, Conv1dDims const& d) {
  check_width(d);
  check_cuda_x_dtype(a.x, {{"residual", &a.residual}, {"y", &a.y}});
  check_cuda_small_dtypes({{"weight", &a.weight},
                           {"bias", &a.bias},
                           {"initial_state", &a.initial_state},
                           {"final_state", &a.final_state}});
  check_cuda_contiguous({{"x", &a.x},
                         {"weight", &a.weight},
                         {"bias", &a.bias},
                         {"residual", &a.residual},
                         {"initial_state", &a.initial_state},
                         {"cu_seqlens", &a.cu_seqlens}});
}

void check_conv1d_cuda_backward(cakeConv1dBackwardArgs_t const& a, Conv1dDims const& d) {
  check_width(d);
  check_cuda_x_dtype(a.x, {{"dy", &a.dy}, {"dx", &a.dx}, {"dresidual", &a.dresidual}});
  check_cuda_small_dtypes({{"weight", &a.weight},
                           {"bias", &a.bias},
                           {"initial_state", &a.initial_state},
                           {"dht", &a.dht},
                           {"dweight", &a.dweight},
                           {"dbias", &a.dbias},
                           {"dinitial_state", &a.dinitial_state}});
  check_cuda_contiguous({{"x", &a.x},
                         {"weight", &a.weight},
                         {"bias", &a.bias},
                         {"initial_state", &a.initial_state},
                         {"cu_seqlens", &a.cu_seqlens}});
}

}  // namespace cake::ops
