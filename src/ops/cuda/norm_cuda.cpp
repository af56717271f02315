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
#include "ops/cuda/checks.hpp"
#include "ops/cuda/device_guard.hpp"

namespace cake::ops {

namespace {

kernels::norm_bwd::Workspace backward_workspace(cakeRmsNormBackwardArgs_t const& a,
                                                NormDims const& d) {
  return kernels::norm_bwd::workspace_layout(d.rows, static_cast<int>(d.dim),
                                             static_cast<int>(element_size(a.x.dtype)),
                                             present(a.dweight));
}

}  // namespace

size_t norm_cuda_backward_workspace_bytes(cakeRmsNormBackwardArgs_t const& a, NormDims const& d) {
  return backward_workspace(a, d).bytes;
}

void norm_cuda_forward(cakeRmsNormForwardArgs_t const& a, NormDims const& d, void* stream) {
  // Rows move in 16-byte vectors: N * bytes is a multiple of 16 (support check), so aligned bases
  // keep every row aligned.
  cuda::check_aligned("x", a.x, 16);
  cuda::check_aligned("g", a.g, 16);
  cuda::check_aligned("y", a.y, 16);
  cuda::DeviceGuard const device(a.x.device_id);
  kernels::norm_fwd::Params p;
  p.rows = d.rows;
  p.dim = static_cast<int32_t>(d.dim);
  p.layout = kernels::norm::row_layout(d.rows, static_cast<int>(d.dim),
                                       static_cast<int>(element_size(a.x.dtype)));
  p.activation = a.activation;
  p.eps = static_cast<float>(a.eps);
  p.x_dtype = a.x.dtype;
  p.x = a.x.data;
  p.g = a.g.data;
  p.weight = a.weight.data;
  p.weight_dtype = a.weight.dtype;
  p.y = a.y.data;
  p.rstd = static_cast<float*>(a.rstd.data);
  cuda::check_cuda(kernels::norm_fwd::launch(p, static_cast<cudaStream_t>(stream)),
                   "norm_fwd launch");
}

void norm_cuda_backward(cakeRmsNormBackwardArgs_t const& a, NormDims const& d, void* workspace,
                        size_t, void* stream) {
  cuda::check_aligned("x", a.x, 16);
  cuda::check_aligned("g", a.g, 16);
  cuda::check_aligned("dy", a.dy, 16);
  cuda::check_aligned("dx", a.dx, 16);
  cuda::check_aligned("dg", a.dg, 16);
  // The partial sums are fp32 rows of N (a multiple of 8) values.
  CAKE_CHECK(
      workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 == 0, cakeInvalidArgument,
      "workspace must be 16-byte aligned for the norm's CUDA kernels, got address ", workspace);
  cuda::DeviceGuard const device(a.x.device_id);
  kernels::norm_bwd::Workspace const ws = backward_workspace(a, d);
  kernels::norm_bwd::Params p;
  p.rows = d.rows;
  p.dim = static_cast<int32_t>(d.dim);
  p.layout = ws.layout;
  p.activation = a.activation;
  p.x_dtype = a.x.dtype;
  p.x = a.x.data;
  p.g = a.g.data;
  p.weight = a.weight.data;
  p.weight_dtype = a.weight.dtype;
  p.rstd = static_cast<float const*>(a.rstd.data);
  p.dy = a.dy.data;
  p.dx = a.dx.data;
  p.dg = a.dg.data;
  p.dweight = a.dweight.data;
  p.dweight_dtype = a.dweight.dtype;
  if (present(a.dweight) && ws.bytes > 0) p.dweight_partial = static_cast<float*>(workspace);
  cuda::check_cuda(kernels::norm_bwd::launch(p, static_cast<cudaStream_t>(stream)),
                   "norm_bwd launch");
}

}  // namespace cake::ops
