// The conv's GPU path: validated arguments -> the stages' Params -> conv1d_fwd (y, final_state)
// or conv1d_bwd (dx, dresidual, dinitial_state, and dweight, dbias through per-tile partial sums
// in the workspace). Nothing is read back to the host: capturable in a CUDA graph.
#include "ops/conv1d_cuda.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/conv1d_bwd/launch.hpp"
#include "kernels/conv1d_fwd/launch.hpp"
#include "ops/cuda/checks.hpp"
#include "ops/cuda/device_guard.hpp"

namespace cake::ops {

namespace {

// Vector loads of a stage's `channels` channels a thread: D a multiple of them and every
// token-major base aligned to their bytes.
bool vectorised(Conv1dDims const& d, int channels, cakeDtype_t x_dtype,
                std::initializer_list<cakeTensor_t const*> tensors) {
  if (d.dim % channels != 0) return false;
  auto const bytes = static_cast<uintptr_t>(channels * element_size(x_dtype));
  for (cakeTensor_t const* t : tensors) {
    if (present(*t) && reinterpret_cast<uintptr_t>(t->data) % bytes != 0) return false;
  }
  return true;
}

// Bulk copies of the token-major inputs' rows (kernels/common/conv1d.cuh, RowRing): every row,
// so every block's segment of it, 16-byte aligned.
bool bulk_rows(Conv1dDims const& d, cakeDtype_t x_dtype,
               std::initializer_list<cakeTensor_t const*> inputs) {
  if (d.dim * static_cast<int64_t>(element_size(x_dtype)) % 16 != 0) return false;
  for (cakeTensor_t const* t : inputs) {
    if (present(*t) && reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  }
  return true;
}

kernels::conv1d_bwd::Workspace backward_workspace(cakeConv1dBackwardArgs_t const& a,
                                                  Conv1dDims const& d) {
  return kernels::conv1d_bwd::workspace_layout(d.batch * d.seq_len, d.dim, d.width,
                                               static_cast<int>(element_size(a.x.dtype)),
                                               present(a.dweight), present(a.dbias));
}

}  // namespace

size_t conv1d_cuda_forward_workspace_bytes(cakeConv1dForwardArgs_t const&, Conv1dDims const&) {
  return 0;
}

size_t conv1d_cuda_backward_workspace_bytes(cakeConv1dBackwardArgs_t const& a,
                                            Conv1dDims const& d) {
  return backward_workspace(a, d).bytes;
}

void conv1d_cuda_forward(cakeConv1dForwardArgs_t const& a, Conv1dDims const& d, void*, size_t,
                         void* stream) {
  cuda::DeviceGuard const device(a.x.device_id);
  kernels::conv1d_fwd::Params p;
  p.num_tokens = d.batch * d.seq_len;
  p.seq_len = d.seq_len;
  p.num_seqs = d.num_seqs;
  p.dim = static_cast<int32_t>(d.dim);
  p.width = static_cast<int32_t>(d.width);
  p.activation = a.activation;
  p.x_dtype = a.x.dtype;
  p.vectorised = vectorised(
      d, kernels::conv1d_fwd::channels_per_thread(static_cast<int>(element_size(a.x.dtype))),
      a.x.dtype, {&a.x, &a.residual, &a.y});
  p.bulk_rows = bulk_rows(d, a.x.dtype, {&a.x, &a.residual});
  p.x = a.x.data;
  p.residual = a.residual.data;
  p.y = a.y.data;
  p.weight = a.weight.data;
  p.weight_dtype = a.weight.dtype;
  p.bias = a.bias.data;
  p.bias_dtype = a.bias.dtype;
  p.initial_state = a.initial_state.data;
  p.initial_state_dtype = a.initial_state.dtype;
  p.final_state = a.final_state.data;
  p.final_state_dtype = a.final_state.dtype;
  p.cu_seqlens = a.cu_seqlens.data;
  p.cu_int64 = a.cu_seqlens.dtype == cakeInt64;
  cuda::check_cuda(kernels::conv1d_fwd::launch(p, static_cast<cudaStream_t>(stream)),
                   "conv1d_fwd launch");
}

void conv1d_cuda_backward(cakeConv1dBackwardArgs_t const& a, Conv1dDims const& d, void* workspace,
                          size_t, void* stream) {
  cuda::DeviceGuard const device(a.x.device_id);
  // The partial sums are fp32 stores at offsets of 16-byte multiples from the base.
  CAKE_CHECK(workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 16 == 0,
             cakeInvalidArgument,
             "workspace must be 16-byte aligned for the conv's CUDA kernels, "
             "got address ",
             workspace);
  kernels::conv1d_bwd::Workspace const ws = backward_workspace(a, d);
  kernels::conv1d_bwd::Params p;
  p.num_tokens = d.batch * d.seq_len;
  p.seq_len = d.seq_len;
  p.num_seqs = d.num_seqs;
  p.dim = static_cast<int32_t>(d.dim);
  p.width = static_cast<int32_t>(d.width);
  p.activation = a.activation;
  p.x_dtype = a.x.dtype;
  p.vectorised = vectorised(
      d, kernels::conv1d_bwd::channels_per_thread(static_cast<int>(element_size(a.x.dtype))),
      a.x.dtype, {&a.x, &a.dy, &a.dx, &a.dresidual});
  p.bulk_rows = bulk_rows(d, a.x.dtype, {&a.x, &a.dy});
  p.x = a.x.data;
  p.dy = a.dy.data;
  p.dx = a.dx.data;
  p.dresidual = a.dresidual.data;
  p.weight = a.weight.data;
  p.weight_dtype = a.weight.dtype;
  p.bias = a.bias.data;
  p.bias_dtype = a.bias.dtype;
  p.initial_state = a.initial_state.data;
  p.initial_state_dtype = a.initial_state.dtype;
  p.dht = a.dht.data;
  p.dht_dtype = a.dht.dtype;
  p.dweight = a.dweight.data;
  p.dweight_dtype = a.dweight.dtype;
  p.dbias = a.dbias.data;
  p.dbias_dtype = a.dbias.dtype;
  p.dinitial_state = a.dinitial_state.data;
  p.dinitial_state_dtype = a.dinitial_state.dtype;
  p.cu_seqlens = a.cu_seqlens.data;
  p.cu_int64 = a.cu_seqlens.dtype == cakeInt64;
  p.tile_tokens = ws.tile_tokens;
  p.num_tiles = ws.num_tiles;
  char* base = static_cast<char*>(workspace);
  if (present(a.dweight)) p.dweight_partial = reinterpret_cast<float*>(base + ws.dweight_offset);
  if (present(a.dbias)) p.dbias_partial = reinterpret_cast<float*>(base + ws.dbias_offset);
  cuda::check_cuda(kernels::conv1d_bwd::launch(p, static_cast<cudaStream_t>(stream)),
                   "conv1d_bwd launch");
}

}  // namespace cake::ops
