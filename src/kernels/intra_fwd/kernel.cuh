// Intra-chunk forward (F1-F3 of fla_reference.md §2.2, fused): one CTA per (chunk, value head).
//
//   G    = cumsum(g) within the chunk                                     [64]      fp32
//   L_ij = beta_i <k_i, k_j> e^{G_i - G_j}  (i > j), strictly lower        [64 x 64] fp32
//   T    = (I + L)^-1 by blocked forward substitution                      [64 x 64] fp32
//   W    = T diag(beta) (K e^G)                                            [64 x 128] bf16 out
//   U    = T diag(beta) V                                                  [64 x 128] bf16 out
// KK^T, W and U run on the tensor cores (bf16 operands, fp32 accumulation; T is rounded to bf16
// as an operand, as FLA does). The solve: 16x16 diagonal blocks by substitution in fp32 (one warp
// each, no barrier), then two pairwise merges (16 -> 32 -> 64) as 3xTF32 tensor-core products
// (about fp32 accuracy, as FLA's ieee-precision merges), two barriers in all. The earlier form,
// three levels of fp32 CUDA-core dot products with index arithmetic per element, was half of the
// kernel's instructions (the kernel is issue-bound: IPC 1.9, perf-notes.md).
// e^{G_i - G_j} is formed pair by pair (i >= j), so it never exceeds 1, whatever the gates
// (g = -20 per token only underflows to 0).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/common/tril_inverse.cuh"
#include "kernels/intra_fwd/params.hpp"

namespace cake::kernels::intra_fwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kLdT = kChunk + 8;  // bf16 copy of T: 144-byte rows, ldmatrix conflict-free

// About 74 KB: three CTAs per SM (bf16(T) takes L's place once the solve is done).
struct SharedStorage {
  __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128] keys (zero past the end); then beta e^G K
  __nv_bfloat16 v[kChunk * kLdBf16];  // [64 x 128] values; then beta V
  union {
    float l[kChunk * kLd64];          // [64 x 64]  L, read by the solve only
    __nv_bfloat16 tb[kChunk * kLdT];  // [64 x 64]  bf16(T), the operand of W and U
  };
  float t[kChunk * kLd64];            // [64 x 64]  T = (I + L)^-1
  float y[kTrilScratch];              // [4 warps x 32 x 8] Y of the solve's merges
  float gcum[kChunk];                 // G
  float beta[kChunk];
  float beta_eg[kChunk];              // beta_i e^{G_i}
};
static_assert(sizeof(SharedStorage) <= 75 * 1024, "intra_fwd must fit three CTAs per SM");
static_assert(kThreads == kTrilThreads, "the solve runs on the whole CTA");

__global__ void __launch_bounds__(kThreads, 3) intra_fwd_kernel(__grid_constant__ Params const p) {
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

  load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                              int64_t{H} * kHeadDim, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(
      s.v, kLdBf16, p.v + (c.t0 * HV + hv) * kHeadDim, int64_t{HV} * kHeadDim, len);
  cp_async_commit();
  if (tid < kChunk) {
    int64_t const row = (c.t0 + tid) * HV + hv;
    s.gcum[tid] = tid < len ? p.g[row] : 0.f;
    s.beta[tid] = tid < len ? load_scalar(p.beta, row, p.beta_is_bf16) : 0.f;
  }
  __syncthreads();
  warp_cumsum64(s.gcum);
  cp_async_wait<0>();
  __syncthreads();  // k, v, G visible
  if (tid < kChunk) {
    s.beta_eg[tid] = s.beta[tid] * __expf(s.gcum[tid]);
    if (tid < len) p.gcum[(c.t0 + tid) * HV + hv] = s.gcum[tid];
  }

  // L = strictly-lower(beta_i (K K^T)_ij e^{G_i - G_j})
  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.k, kLdBf16}, ColMajor{s.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
        float const bi = s.beta[i];
        float const gi = s.gcum[i];
        s.l[i * kLd64 + j] = i > j ? bi * c0 * __expf(gi - s.gcum[j]) : 0.f;
        s.l[i * kLd64 + j + 1] = i > j + 1 ? bi * c1 * __expf(gi - s.gcum[j + 1]) : 0.f;
      });
  __syncthreads();  // L complete, beta_eg visible; K is free to be rescaled

  // K <- diag(beta e^G) K, V <- diag(beta) V, in place (the operands X, Y of W = T X, U = T Y)
  for (int idx = tid; idx < kChunk * kHeadDim / 2; idx += kThreads) {
    int const r = idx / (kHeadDim / 2);
    int const col = (idx % (kHeadDim / 2)) * 2;
    auto* k2 = reinterpret_cast<__nv_bfloat162*>(s.k + r * kLdBf16 + col);
    auto* v2 = reinterpret_cast<__nv_bfloat162*>(s.v + r * kLdBf16 + col);
    float2 const kf = __bfloat1622float2(*k2);
    float2 const vf = __bfloat1622float2(*v2);
    *k2 = __floats2bfloat162_rn(s.beta_eg[r] * kf.x, s.beta_eg[r] * kf.y);
    *v2 = __floats2bfloat162_rn(s.beta[r] * vf.x, s.beta[r] * vf.y);
  }

  // T = (I + L)^-1 (common/tril_inverse.cuh), then its bf16 copy (the operand of W and U)
  {
    invert_unit_lower_64(s.l, s.t, s.y);
    for (int idx = tid; idx < kChunk * kChunk; idx += kThreads) {
      int const i = idx / kChunk;
      int const j = idx % kChunk;
      s.tb[i * kLdT + j] = __float2bfloat16(s.t[i * kLd64 + j]);
    }
    __syncthreads();
  }

  if (p.tmat != nullptr) {
    for (int idx = tid; idx < len * kChunk; idx += kThreads) {
      int const i = idx / kChunk;
      int const j = idx % kChunk;
      p.tmat[((c.t0 + i) * HV + hv) * kChunk + j] = s.t[i * kLd64 + j];
    }
  }

  // W = T X,  U = T Y
  __nv_bfloat16* const w = p.w + (c.t0 * HV + hv) * kHeadDim;
  __nv_bfloat16* const u = p.u + (c.t0 * HV + hv) * kHeadDim;
  int64_t const stride = int64_t{HV} * kHeadDim;
  block_gemm<kChunk, kHeadDim, kChunk, 2, 4, kWarps>(
      RowMajor{s.tb, kLdT}, RowMajor{s.k, kLdBf16}, [&](int i, int col, float c0, float c1) {
        if (i < len)
          *reinterpret_cast<__nv_bfloat162*>(w + i * stride + col) = __floats2bfloat162_rn(c0, c1);
      });
  block_gemm<kChunk, kHeadDim, kChunk, 2, 4, kWarps>(
      RowMajor{s.tb, kLdT}, RowMajor{s.v, kLdBf16}, [&](int i, int col, float c0, float c1) {
        if (i < len)
          *reinterpret_cast<__nv_bfloat162*>(u + i * stride + col) = __floats2bfloat162_rn(c0, c1);
      });
#endif
}

}  // namespace cake::kernels::intra_fwd
