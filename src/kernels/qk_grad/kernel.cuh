// q/k gradient reduction: dq[t, h] and dk[t, h] = the sums over the value heads hv of q/k head h,
// in ascending order, of dq_hv[t, hv] and dk_hv[t, hv] (walk_a_bwd's per-value-head terms), in
// fp32 and converted to bf16 once; with use_qk_l2norm first the norm's backward
//   dx = rstd (dy - <dy, y> y),  y = x rstd,  rstd = 1 / sqrt(sum x^2 + 1e-6)
// from qk_norm's bf16 y and fp32 rstd (FLA's l2norm_bwd form: the caller's x is not read, so the
// backward need not keep it). One warp per (token, q/k head) row; 4 elements per lane.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"
#include "kernels/qk_grad/params.hpp"

namespace cake::kernels::qk_grad {

inline constexpr int kThreads = 256;

// This lane's 4 elements of a 128-element fp32 row.
__device__ __forceinline__ float4 load_row4(float const* row) {
  return reinterpret_cast<float4 const*>(row)[threadIdx.x % 32];
}

// dx = bf16(dy), through the L2 norm's backward with use_l2norm (y: the row's bf16 y, rstd its
// rstd).
__device__ __forceinline__ void finish_row(Params const& p, __nv_bfloat16 const* y, float rstd,
                                           float4 dy, __nv_bfloat16* dx) {
  int const lane = threadIdx.x % 32;
  if (p.use_l2norm) {
    float2 const a = __bfloat1622float2(reinterpret_cast<__nv_bfloat162 const*>(y)[2 * lane]);
    float2 const b = __bfloat1622float2(reinterpret_cast<__nv_bfloat162 const*>(y)[2 * lane + 1]);
    float dot = dy.x * a.x + dy.y * a.y + dy.z * b.x + dy.w * b.y;
    for (int d = 16; d > 0; d /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, d);
    dy = make_float4(rstd * (dy.x - dot * a.x), rstd * (dy.y - dot * a.y),
                     rstd * (dy.z - dot * b.x), rstd * (dy.w - dot * b.y));
  }
  reinterpret_cast<__nv_bfloat162*>(dx)[2 * lane] = __floats2bfloat162_rn(dy.x, dy.y);
  reinterpret_cast<__nv_bfloat162*>(dx)[2 * lane + 1] = __floats2bfloat162_rn(dy.z, dy.w);
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
    finish_row(p, l2 ? p.q_norm + row * kHeadDim : nullptr, l2 ? p.q_rstd[row] : 0.f,
               sum_value_heads(p.dq_hv, row, p.group_size), p.dq + row * kHeadDim);
  if (p.dk != nullptr)
    finish_row(p, l2 ? p.k_norm + row * kHeadDim : nullptr, l2 ? p.k_rstd[row] : 0.f,
               sum_value_heads(p.dk_hv, row, p.group_size), p.dk + row * kHeadDim);
}

}  // namespace cake::kernels::qk_grad
