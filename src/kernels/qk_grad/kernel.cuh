// q/k gradient reduction: dq[t, h] and dk[t, h] = the sums over the value heads hv of q/k head h,
// in ascending order, of dq_hv[t, hv] and dk_hv[t, hv] (walk_a_bwd's per-value-head terms), in
// fp32 and converted to bf16 once, with use_qk_l2norm through the norm's backward first
// (finish_row.cuh). One warp per (token, q/k head) row; 4 elements per lane.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"
#include "kernels/qk_grad/finish_row.cuh"
#include "kernels/qk_grad/params.hpp"

namespace cake::kernels::qk_grad {

inline constexpr int kThreads = 256;

// This lane's 4 elements of a 128-element fp32 row.
__device__ __forceinline__ float4 load_row4(float const* row) {
  return reinterpret_cast<float4 const*>(row)[threadIdx.x % 32];
}

// The sum over the value heads of q/k row `row` (= t H + h; value head h G + gi of token t is row
// row G + gi of [BT, HV]) of this lane's 4 elements of x_hv, in ascending value-head order.
__device__ __forceinline__ float4 sum_value_heads(float const* x_hv, int64_t row, int group) {
  float4 sum = load_row4(x_hv + row * group * kHeadDim);
  for (int gi = 1; gi < group; ++gi) {
    float4 const d = load_row4(x_hv + (row * group + gi) * kHeadDim);
    sum.x += d.x;
    sum.y += d.y;
    sum.z += d.z;
    sum.w += d.w;
  }
  return sum;
}

__global__ void __launch_bounds__(kThreads) qk_grad_kernel(__grid_constant__ Params const p) {
  int64_t const row = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / 32;
  if (row >= p.num_tokens * p.num_qk_heads) return;
  bool const l2 = p.use_l2norm;
  if (p.dq != nullptr)
    finish_row(l2, l2 ? p.q_norm + row * kHeadDim : nullptr, l2 ? p.q_rstd[row] : 0.f,
               sum_value_heads(p.dq_hv, row, p.group_size), p.dq + row * kHeadDim);
  if (p.dk != nullptr)
    finish_row(l2, l2 ? p.k_norm + row * kHeadDim : nullptr, l2 ? p.k_rstd[row] : 0.f,
               sum_value_heads(p.dk_hv, row, p.group_size), p.dk + row * kHeadDim);
}

}  // namespace cake::kernels::qk_grad
