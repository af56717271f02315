// Intra-chunk forward (stage F1-F3 of fla_reference.md §2.2, fused): one CTA per (chunk, value head).
//
//   G    = cumsum(g) within the chunk                                     [64]      fp32
//   L_ij = beta_i <k_i, k_j> e^{G_i - G_j}  (i > j), strictly lower        [64 x 64] fp32
//   T    = (I + L)^-1 by forward substitution                              [64 x 64] fp32 (exact)
//   W    = T diag(beta) (K e^G)                                            [64 x 128] bf16 out
//   U    = T diag(beta) V                                                  [64 x 128] bf16 out
// KK^T, W and U run on the tensor cores (bf16 operands, fp32 accumulation; T is rounded to bf16
// as an operand, as FLA does). The solve is fp32 on the CUDA cores: 64 dependent row steps, each
// row's 64 entries computed by 4 threads per column. e^{G_i - G_j} is formed pair by pair (i >= j),
// so it never exceeds 1, whatever the gates (g = -20 per token only underflows to 0).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/intra_fwd/params.hpp"

namespace cake::kernels::intra_fwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;

struct SharedStorage {
  __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128] keys of the chunk (zero past its end)
  __nv_bfloat16 v[kChunk * kLdBf16];  // [64 x 128] values
  float l[kChunk * kLd64];            // [64 x 64]  L
  float t[kChunk * kLd64];            // [64 x 64]  T = (I + L)^-1
  float gcum[kChunk];                 // G
  float beta[kChunk];
  float beta_eg[kChunk];              // beta_i e^{G_i}
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "intra_fwd shared memory exceeds 227 KB");

__global__ void __launch_bounds__(kThreads) intra_fwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  ChunkRef c;
  if (!find_chunk(p.problem, blockIdx.x, c)) return;
  int const hv = blockIdx.y;
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const h = hv / p.problem.group_size();
  int const len = c.len;
  int const tid = threadIdx.x;

  load_tile_bf16<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                             int64_t{H} * kHeadDim, len);
  load_tile_bf16<kChunk, kHeadDim, kThreads>(s.v, kLdBf16, p.v + (c.t0 * HV + hv) * kHeadDim,
                                             int64_t{HV} * kHeadDim, len);
  if (tid < kChunk) {
    int64_t const row = (c.t0 + tid) * HV + hv;
    s.gcum[tid] = tid < len ? p.g[row] : 0.f;
    s.beta[tid] = tid < len ? load_scalar(p.beta, row, p.beta_is_bf16) : 0.f;
  }
  __syncthreads();
  warp_cumsum64(s.gcum);
  __syncthreads();
  if (tid < kChunk) {
    s.beta_eg[tid] = s.beta[tid] * __expf(s.gcum[tid]);
    if (tid < len) {
      int64_t const row = (c.t0 + tid) * HV + hv;
      p.gcum[row] = s.gcum[tid];
    }
  }

  // L = strictly-lower(beta_i (K K^T)_ij e^{G_i - G_j})
  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      [&](int i, int kk) { return to_float(s.k[i * kLdBf16 + kk]); },
      [&](int kk, int j) { return to_float(s.k[j * kLdBf16 + kk]); },
      [&](int i, int j, float acc) {
        s.l[i * kLd64 + j] = i > j ? s.beta[i] * acc * __expf(s.gcum[i] - s.gcum[j]) : 0.f;
      });
  __syncthreads();

  // T row i = e_i - sum_{j <= m < i} L_im T_mj: 4 threads per column j, one row per step.
  {
    int const j = tid / 4;
    int const part = tid % 4;
    for (int i = 0; i < kChunk; ++i) {
      float acc = 0.f;
      for (int m = j + part; m < i; m += 4) acc += s.l[i * kLd64 + m] * s.t[m * kLd64 + j];
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      if (part == 0) s.t[i * kLd64 + j] = (i == j) ? 1.f : (j < i ? -acc : 0.f);
      __syncthreads();
    }
  }

  if (p.tmat != nullptr) {
    for (int idx = tid; idx < len * kChunk; idx += kThreads) {
      int const i = idx / kChunk;
      int const j = idx % kChunk;
      p.tmat[((c.t0 + i) * HV + hv) * kChunk + j] = s.t[i * kLd64 + j];
    }
  }

  // W = T diag(beta e^G) K,  U = T diag(beta) V
  block_gemm<kChunk, kHeadDim, kChunk, 2, 4, kWarps>(
      [&](int i, int m) { return s.t[i * kLd64 + m]; },
      [&](int m, int col) { return s.beta_eg[m] * to_float(s.k[m * kLdBf16 + col]); },
      [&](int i, int col, float acc) {
        if (i < len) p.w[((c.t0 + i) * HV + hv) * kHeadDim + col] = __float2bfloat16(acc);
      });
  block_gemm<kChunk, kHeadDim, kChunk, 2, 4, kWarps>(
      [&](int i, int m) { return s.t[i * kLd64 + m]; },
      [&](int m, int col) { return s.beta[m] * to_float(s.v[m * kLdBf16 + col]); },
      [&](int i, int col, float acc) {
        if (i < len) p.u[((c.t0 + i) * HV + hv) * kHeadDim + col] = __float2bfloat16(acc);
      });
#endif
}

}  // namespace cake::kernels::intra_fwd
