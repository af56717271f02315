// The norm's GPU path: validated arguments -> the stages' Params -> norm_fwd (y, rstd) or norm_bwd
// (dx, dg, and dweight through per-block partial sums in the workspace). Nothing is read back to
// the host: capturable in a CUDA graph.
#include "ops/norm_cuda.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/norm_bwd/launch.hpp"
#include "kernels/norm_fwd/launch.hpp"
#include "ops/cuda/device_guard.hpp"

namespace cake::ops {

namespace {

void check_launch(cudaError_t err, char const* what) {
  if (err != cudaSuccess)
    throw Error(cakeCudaError,
                concat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

int dtype_bytes(cakeDtype_t dtype) { return dtype == cakeFloat32 ? 4 : 2; }

// The kernels read and write rows in 16-byte vectors: N * bytes is a multiple of 16 (support
// check), so aligned bases keep every row aligned.
void check_aligned(std::initializer_list<std::pair<char const*, cakeTensor_t const*>> tensors) {
  for (auto [name, t] : tensors) {
    if (!present(*t)) continue;
    CAKE_CHECK(reinterpret_cast<uintptr_t>(t->data) % 16 == 0, cakeNotSupported, name,
               " must be 16-byte aligned for the norm's CUDA kernels, got address ", t->data);
  }
}

// The data of an optional tensor (absent: nullptr).
void* data_or_null(cakeTensor_t const& t) { return present(t) ? t.data : nullptr; }

kernels::norm_bwd::Workspace backward_workspace(cakeRmsNormBackwardArgs_t const& a,
                                                NormDims const& d) {
  return kernels::norm_bwd::workspace_layout(d.rows, static_cast<int>(d.dim),
                                             dtype_bytes(a.x.dtype), present(a.dweight));
}

}  // namespace

size_t norm_cuda_backward_workspace_bytes(cakeRmsNormBackwardArgs_t const& a, NormDims const& d) {
  return backward_workspace(a, d).bytes;
}

void norm_cuda_forward(cakeRmsNormForwardArgs_t const& a, NormDims const& d, void* stream) {
  check_aligned({{"x", &a.x}, {"g", &a.g}, {"y", &a.y}});
  cuda::DeviceGuard const device(a.x.device_id);
  kernels::norm::RowLayout const layout =
      kernels::norm::row_layout(d.rows, static_cast<int>(d.dim), dtype_bytes(a.x.dtype));
  kernels::norm_fwd::Params p;
  p.rows = d.rows;
  p.dim = static_cast<int32_t>(d.dim);
  p.lanes = layout.lanes;
  p.slots = layout.slots;
  p.num_blocks = layout.num_blocks;
  p.activation = a.activation;
  p.eps = static_cast<float>(a.eps);
  p.x_dtype = a.x.dtype;
  p.x = a.x.data;
  p.g = data_or_null(a.g);
  p.weight = data_or_null(a.weight);
  p.weight_dtype = a.weight.dtype;
  p.y = a.y.data;
  p.rstd = static_cast<float*>(a.rstd.data);
  check_launch(kernels::norm_fwd::launch(p, static_cast<cudaStream_t>(stream)), "norm_fwd launch");
}

void norm_cuda_backward(cakeRmsNormBackwardArgs_t const& a, NormDims const& d, void* workspace,
                        size_t, void* stream) {
  check_aligned({{"x", &a.x}, {"g", &a.g}, {"dy", &a.dy}, {"dx", &a.dx}, {"dg", &a.dg}});
  // The partial sums are fp32 rows of N (a multiple of 8) values.
  CAKE_CHECK(
      workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 == 0, cakeInvalidArgument,
      "workspace must be 16-byte aligned for the norm's CUDA kernels, got address ", workspace);
  cuda::DeviceGuard const device(a.x.device_id);
  kernels::norm_bwd::Workspace const ws = backward_workspace(a, d);
  kernels::norm_bwd::Params p;
  p.rows = d.rows;
  p.dim = static_cast<int32_t>(d.dim);
  p.lanes = ws.layout.lanes;
  p.slots = ws.layout.slots;
  p.num_blocks = ws.layout.num_blocks;
  p.activation = a.activation;
  p.x_dtype = a.x.dtype;
  p.x = a.x.data;
  p.g = data_or_null(a.g);
  p.weight = data_or_null(a.weight);
  p.weight_dtype = a.weight.dtype;
  p.rstd = static_cast<float const*>(a.rstd.data);
  p.dy = a.dy.data;
  p.dx = data_or_null(a.dx);
  p.dg = data_or_null(a.dg);
  p.dweight = data_or_null(a.dweight);
  p.dweight_dtype = a.dweight.dtype;
  if (present(a.dweight) && ws.bytes > 0) p.dweight_partial = static_cast<float*>(workspace);
  check_launch(kernels::norm_bwd::launch(p, static_cast<cudaStream_t>(stream)), "norm_bwd launch");
}

}  // namespace cake::ops
