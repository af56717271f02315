// q/k gradient reduction: dq[t, h] and dk[t, h] = the sums over the value heads hv of q/k head h,
// in ascending order, of dq_hv[t, hv] and dk_hv[t, hv] (walk_a_bwd's per-value-head terms), in
// fp32 and converted to bf16 once; with use_qk_l2norm first the norm's backward
//   dx = rstd (dy - <dy, y> y),  y = x rstd,  rstd = 1 / sqrt(sum x^2 + 1e-6)
// recomputed from the caller's x. One warp per (token, q/k head) row; 4 elements per lane.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"
#include "kernels/qk_grad/params.hpp"

namespace cake::kernels::qk_grad {

inline constexpr int kThreads = 256;
inline constexpr float kEps = 1e-6f;

// This lane's 4 elements of a 128-element fp32 row.
__device__ __forceinline__ float4 load_row4(float const* row) {
  return reinterpret_cast<float4 const*>(row)[threadIdx.x % 32];
}

// dx = bf16(dy), through the L2 norm's backward with use_l2norm.
__device__ __forceinline__ void finish_row(Params const& p, __nv_bfloat16 const* x, float4 dy,
                                           __nv_bfloat16* dx) {
  int const lane = threadIdx.x % 32;
  if (p.use_l2norm) {
    float2 const a = __bfloat1622float2(reinterpret_cast<__nv_bfloat162 const*>(x)[2 * lane]);
    float2 const b = __bfloat1622float2(reinterpret_cast<__nv_bfloat162 const*>(x)[2 * lane + 1]);
    float ss = a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
    for (int d = 16; d > 0; d /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, d);
    float const rstd = rsqrtf(ss + kEps);
    float4 const y = make_float4(a.x * rstd, a.y * rstd, b.x * rstd, b.y * rstd);
    float dot = dy.x * y.x + dy.y * y.y + dy.z * y.z + dy.w * y.w;
    for (int d = 16; d > 0; d /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, d);
    dy = make_float4(rstd * (dy.x - dot * y.x), rstd * (dy.y - dot * y.y),
                     rstd * (dy.z - dot * y.z), rstd * (dy.w - dot * y.w));
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
  if (p.dq != nullptr)
    finish_row(p, p.q + row * kHeadDim, sum_value_heads(p.dq_hv, row, p.group_size),
               p.dq + row * kHeadDim);
  if (p.dk != nullptr)
    finish_row(p, p.k + row * kHeadDim, sum_value_heads(p.dk_hv, row, p.group_size),
               p.dk + row * kHeadDim);
}

}  // namespace cake::kernels::qk_grad
