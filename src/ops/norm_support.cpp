#include "ops/norm_support.hpp"

#include <initializer_list>
#include <utility>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace cake::ops {

namespace {

using Named = std::pair<char const*, cakeTensor_t const*>;

// The row-major tensors, which the kernels read and write in x's dtype.
void check_row_dtypes(cakeTensor_t const& x, std::initializer_list<Named> tensors) {
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

// weight and dweight: any of the kernels' three float dtypes, whatever x's (the kernels read and
// write N of them through a runtime dtype, as flash-linear-attention's norm takes a weight of
// another dtype than x).
void check_weight_dtypes(std::initializer_list<Named> tensors) {
  for (auto [name, t] : tensors) {
    if (!present(*t)) continue;
    CAKE_CHECK(t->dtype == cakeFloat32 || t->dtype == cakeBfloat16 || t->dtype == cakeFloat16,
               cakeInvalidArgument, name,
               " must be bfloat16, float16 or float32 for the CUDA kernels, got ",
               dtype_name(t->dtype));
  }
}

void check_rstd_dtype(cakeTensor_t const& rstd) {
  CAKE_CHECK(rstd.dtype == cakeFloat32, cakeInvalidArgument,
             "rstd must be float32 for the CUDA kernels, got ", dtype_name(rstd.dtype));
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

void check_dim(NormDims const& d) {
  CAKE_CHECK(d.dim % kNormCudaDimMultiple == 0 && d.dim <= kNormCudaMaxDim, cakeNotSupported,
             "the CUDA kernels support rows of N values with N a multiple of ",
             kNormCudaDimMultiple, " and N <= ", kNormCudaMaxDim,
             ", got x's last size N = ", d.dim);
}

}  // namespace

char const* const kNormReferenceSupport =
    "FP64 reference: any float dtype (computed in float64), any N, silu or sigmoid gate";

void check_norm_reference_forward(cakeRmsNormForwardArgs_t const&, NormDims const&) {}
void check_norm_reference_backward(cakeRmsNormBackwardArgs_t const&, NormDims const&) {}

char const* const kNormCudaSupport =
    "sm_90a kernels: bfloat16, float16 or float32 x (g, y and the gradients of x and g in x's "
    "dtype), float32 arithmetic; weight bfloat16, float16 or float32; float32 rstd; N a multiple "
    "of 8, N <= 1024; contiguous tensors with 16-byte aligned rows; silu or sigmoid gate";

void check_norm_cuda_forward(cakeRmsNormForwardArgs_t const& a, NormDims const& d) {
  check_dim(d);
  check_row_dtypes(a.x, {{"g", &a.g}, {"y", &a.y}});
  check_weight_dtypes({{"weight", &a.weight}});
  check_rstd_dtype(a.rstd);
  check_contiguous({{"x", &a.x}, {"g", &a.g}, {"weight", &a.weight}});
}

void check_norm_cuda_backward(cakeRmsNormBackwardArgs_t const& a, NormDims const& d) {
  check_dim(d);
  check_row_dtypes(a.x, {{"g", &a.g}, {"dy", &a.dy}, {"dx", &a.dx}, {"dg", &a.dg}});
  check_weight_dtypes({{"weight", &a.weight}, {"dweight", &a.dweight}});
  check_rstd_dtype(a.rstd);
  check_contiguous({{"x", &a.x}, {"g", &a.g}, {"weight", &a.weight}, {"rstd", &a.rstd}});
}

}  // namespace cake::ops
