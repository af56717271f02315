#include "ops/norm_support.hpp"

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "ops/checks.hpp"

namespace cake::ops {

namespace {

void check_rstd_dtype(cakeTensor_t const& rstd) {
  CAKE_CHECK(rstd.dtype == cakeFloat32, cakeInvalidArgument,
             "rstd must be float32 for the CUDA kernels, got ", dtype_name(rstd.dtype));
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
  check_cuda_x_dtype(a.x, {{"g", &a.g}, {"y", &a.y}});
  check_cuda_small_dtypes({{"weight", &a.weight}});
  check_rstd_dtype(a.rstd);
  check_cuda_contiguous({{"x", &a.x}, {"g", &a.g}, {"weight", &a.weight}});
}

void check_norm_cuda_backward(cakeRmsNormBackwardArgs_t const& a, NormDims const& d) {
  check_dim(d);
  check_cuda_x_dtype(a.x, {{"g", &a.g}, {"dy", &a.dy}, {"dx", &a.dx}, {"dg", &a.dg}});
  check_cuda_small_dtypes({{"weight", &a.weight}, {"dweight", &a.dweight}});
  check_rstd_dtype(a.rstd);
  check_cuda_contiguous({{"x", &a.x}, {"g", &a.g}, {"weight", &a.weight}, {"rstd", &a.rstd}});
}

}  // namespace cake::ops
