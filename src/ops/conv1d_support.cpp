#include "ops/conv1d_support.hpp"

#include <initializer_list>
#include <utility>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace cake::ops {

namespace {

using Named = std::pair<char const*, cakeTensor_t const*>;

// The token-major tensors, which the kernels read and write in x's dtype.
void check_token_dtypes(cakeTensor_t const& x, std::initializer_list<Named> tensors) {
  CAKE_CHECK(x.dtype == cakeBfloat16 || x.dtype == cakeFloat16 || x.dtype == cakeFloat32,
             cakeInvalidArgument,
             "x must be bfloat16, float16 or float32 for the CUDA kernels, got ",
             dtype_name(x.dtype));
  for (auto [name, t] : tensors) {
    if (!present(*t)) continue;
    CAKE_CHECK(t->dtype == x.dtype, cakeInvalidArgument, name, " must have x's dtype (",
               dtype_name(x.dtype), ") for the CUDA kernels, got ", dtype_name(t->dtype));
  }
}

// weight, bias and the states: read and written as float32, bfloat16 or float16.
void check_small_dtypes(std::initializer_list<Named> tensors) {
  for (auto [name, t] : tensors) {
    if (!present(*t)) continue;
    CAKE_CHECK(t->dtype != cakeFloat64, cakeInvalidArgument, name,
               " must be float32, bfloat16 or float16 for the CUDA kernels, got float64");
  }
}

void check_contiguous(std::initializer_list<Named> tensors) {
  for (auto [name, t] : tensors) {
    if (!present(*t)) continue;
    CAKE_CHECK(is_contiguous(*t), cakeInvalidArgument, name,
               " must be contiguous for the CUDA kernels (call .contiguous()), got strides that "
               "are not row-major for shape ",
               shape_string(*t));
  }
}

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
  check_token_dtypes(a.x, {{"residual", &a.residual}, {"y", &a.y}});
  check_small_dtypes({{"weight", &a.weight},
                      {"bias", &a.bias},
                      {"initial_state", &a.initial_state},
                      {"final_state", &a.final_state}});
  check_contiguous({{"x", &a.x},
                    {"weight", &a.weight},
                    {"bias", &a.bias},
                    {"residual", &a.residual},
                    {"initial_state", &a.initial_state},
                    {"cu_seqlens", &a.cu_seqlens}});
}

void check_conv1d_cuda_backward(cakeConv1dBackwardArgs_t const& a, Conv1dDims const& d) {
  check_width(d);
  check_token_dtypes(a.x, {{"dy", &a.dy}, {"dx", &a.dx}, {"dresidual", &a.dresidual}});
  check_small_dtypes({{"weight", &a.weight},
                      {"bias", &a.bias},
                      {"initial_state", &a.initial_state},
                      {"dht", &a.dht},
                      {"dweight", &a.dweight},
                      {"dbias", &a.dbias},
                      {"dinitial_state", &a.dinitial_state}});
  check_contiguous({{"x", &a.x},
                    {"weight", &a.weight},
                    {"bias", &a.bias},
                    {"initial_state", &a.initial_state},
                    {"cu_seqlens", &a.cu_seqlens}});
}

}  // namespace cake::ops
