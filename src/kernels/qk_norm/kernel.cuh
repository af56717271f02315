// q/k L2 norm (use_qk_l2norm): y = x / sqrt(sum x^2 + 1e-6) per token and q/k head, in fp32,
// stored in bf16 for the chunk stages (as FLA stores x.dtype), and each row's
// rstd = 1 / sqrt(sum x^2 + 1e-6) in fp32 for the norm's backward (qk_grad), which then needs y
// and rstd but not x (as FLA's l2norm_bwd). One warp per row of 128; each lane holds 4
// consecutive elements.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"
#include "kernels/qk_norm/params.hpp"

namespace cake::kernels::qk_norm {

inline constexpr int kThreads = 256;
inline constexpr float kEps = 1e-6f;
static_assert(kHeadDim == 4 * 32, "one warp of 4-element lanes covers one row");

__device__ __forceinline__ void normalise_row(__nv_bfloat16 const* x, __nv_bfloat16* y,
                                              float* rstd_out) {
  int const lane = threadIdx.x % 32;
  float2 const a = __bfloat1622float2(reinterpret_cast<__nv_bfloat162 const*>(x)[2 * lane]);
  float2 const b = __bfloat1622float2(reinterpret_cast<__nv_bfloat162 const*>(x)[2 * lane + 1]);
  float ss = a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
  for (int d = 16; d > 0; d /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, d);
  float const rstd = rsqrtf(ss + kEps);
  if (lane == 0) *rstd_out = rstd;
  reinterpret_cast<__nv_bfloat162*>(y)[2 * lane] = __floats2bfloat162_rn(a.x * rstd, a.y * rstd);
  reinterpret_cast<__nv_bfloat162*>(y)[2 * lane + 1] =
      __floats2bfloat162_rn(b.x * rstd, b.y * rstd);
}

__global__ void __launch_bounds__(kThreads) qk_norm_kernel(__grid_constant__ Params const p) {
  int64_t const row = (int64_t{blockIdx.x} * kThreads + threadIdx.x) / 32;
  if (row >= p.num_rows) return;
  normalise_row(p.q + row * kHeadDim, p.q_norm + row * kHeadDim, p.q_rstd + row);
  normalise_row(p.k + row * kHeadDim, p.k_norm + row * kHeadDim, p.k_rstd + row);
}

}  // namespace cake::kernels::qk_norm
