// One (token, q/k head) row's gradient to bf16, the L2 norm's backward first with use_l2norm:
//   dx = rstd (dy - <dy, y> y),  y = x rstd,  rstd = 1 / sqrt(sum x^2 + 1e-6)
// from qk_norm's bf16 y and fp32 rstd (FLA's l2norm_bwd form: the caller's x is not read, so the
// backward need not keep it). One warp a row, lane l holding channels 4 l .. 4 l + 3; the dot in
// a fixed tree (each lane's four products in order, then xor 16, 8, 4, 2, 1), so that every
// kernel that finishes rows here (qk_grad, KDA's intra_bwd) gives the same bits.
#pragma once

#include <cuda_bf16.h>

namespace cake::kernels::qk_grad {

// dx = bf16(dy), through the norm's backward with use_l2norm (y: the row's bf16 y, 128
// elements, 4-byte aligned; rstd its rstd; both unread without it); dy: this lane's 4 elements.
__device__ __forceinline__ void finish_row(bool use_l2norm, __nv_bfloat16 const* y, float rstd,
                                           float4 dy, __nv_bfloat16* dx) {
  int const lane = threadIdx.x % 32;
  if (use_l2norm) {
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

}  // namespace cake::kernels::qk_grad
