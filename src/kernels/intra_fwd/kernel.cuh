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

#include <type_traits>

#include "kernels/common/gemm.cuh"
#include "kernels/common/gemm_tf32x3.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/intra_fwd/params.hpp"

namespace cake::kernels::intra_fwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kLdT = kChunk + 8;  // bf16 copy of T: 144-byte rows, ldmatrix conflict-free
inline constexpr int kBlock = 16;        // diagonal blocks of the triangular solve
inline constexpr int kScratchRows = 32;  // per merging warp: Y = L_10 T_00, up to 32 x 8
inline constexpr int kLdScratch = 8;

// About 74 KB: three CTAs per SM (bf16(T) takes L's place once the solve is done).
struct SharedStorage {
  __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128] keys (zero past the end); then beta e^G K
  __nv_bfloat16 v[kChunk * kLdBf16];  // [64 x 128] values; then beta V
  union {
    float l[kChunk * kLd64];          // [64 x 64]  L, read by the solve only
    __nv_bfloat16 tb[kChunk * kLdT];  // [64 x 64]  bf16(T), the operand of W and U
  };
  float t[kChunk * kLd64];            // [64 x 64]  T = (I + L)^-1
  float y[4 * kScratchRows * kLdScratch];  // [4 warps x 32 x 8] Y of the merges
  float gcum[kChunk];                 // G
  float beta[kChunk];
  float beta_eg[kChunk];              // beta_i e^{G_i}
};
static_assert(sizeof(SharedStorage) <= 75 * 1024, "intra_fwd must fit three CTAs per SM");

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

  // T = (I + L)^-1 in 16x16 blocks, merged pairwise (L is strictly lower, so I + L is unit lower):
  //   diagonal blocks T_aa = (I + L_aa)^-1: warp a < 4, lane j < 16 walks column j down by forward
  //   substitution in registers (fp32, no barrier); warps 4-7 zero the blocks above the diagonal;
  //   merge to 32x32:  T_10 = -T_11 (L_10 T_00)  for the 16-blocks (1, 0) and (3, 2);
  //   merge to 64x64:  T_10 = -T_11 (L_10 T_00)  for the 32-blocks.
  // The merges are warp products on the tensor cores in 3xTF32 (about fp32 accuracy), 8 columns
  // per warp: the columns of a merged block are independent, so no warp waits for another.
  {
    constexpr int kB = kBlock;
    int const warp = tid / 32;
    int const lane = tid % 32;
    if (warp < kChunk / kB && lane < kB) {
      int const a0 = warp * kB;
      float col[kB];
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        float acc = i == lane ? 1.f : 0.f;
#pragma unroll
        for (int m = 0; m < i; ++m) acc -= s.l[(a0 + i) * kLd64 + a0 + m] * col[m];
        col[i] = acc;
      }
#pragma unroll
      for (int i = 0; i < kB; ++i) s.t[(a0 + i) * kLd64 + a0 + lane] = col[i];
    } else if (warp >= kChunk / kB) {  // warps 4-7 (idle in the substitution): zero the upper blocks
      for (int idx = tid - kThreads / 2; idx < kChunk * kChunk; idx += kThreads / 2) {
        int const i = idx / kChunk;
        int const j = idx % kChunk;
        if (i / kB < j / kB) s.t[i * kLd64 + j] = 0.f;
      }
    }
    __syncthreads();  // diagonal blocks and zeros visible
    int const g = lane / 4;
    int const q = lane % 4;
    // One merge T_10[:, n0 .. n0 + 8) = -T_11 (L_10 T_00[:, n0 .. n0 + 8)) of two kM-blocks at row
    // and column offset r0 (upper-left block), by one warp; Y goes through the warp's scratch.
    auto const merge = [&](auto m_tiles, int r0, int n0) {
      constexpr int kMt = decltype(m_tiles)::value;
      constexpr int kM = 16 * kMt;
      float* const scratch = s.y + warp * kScratchRows * kLdScratch;
      float y[kMt][4] = {};
      warp_mma_f32x3<kMt, kM>(s.l + (r0 + kM) * kLd64 + r0, kLd64, s.t + r0 * kLd64 + n0, kLd64,
                              y);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        *reinterpret_cast<float2*>(scratch + (16 * mt + g) * kLdScratch + 2 * q) =
            make_float2(y[mt][0], y[mt][1]);
        *reinterpret_cast<float2*>(scratch + (16 * mt + g + 8) * kLdScratch + 2 * q) =
            make_float2(y[mt][2], y[mt][3]);
      }
      __syncwarp();
      float t[kMt][4] = {};
      warp_mma_f32x3<kMt, kM>(s.t + (r0 + kM) * kLd64 + r0 + kM, kLd64, scratch, kLdScratch, t);
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        float* const row = s.t + (r0 + kM + 16 * mt + g) * kLd64 + n0 + 2 * q;
        *reinterpret_cast<float2*>(row) = make_float2(-t[mt][0], -t[mt][1]);
        *reinterpret_cast<float2*>(row + 8 * kLd64) = make_float2(-t[mt][2], -t[mt][3]);
      }
    };
    if (warp < 4) {  // 16-blocks (1, 0) and (3, 2): warp w merges pair w / 2, columns 8 (w % 2)
      int const r0 = (warp / 2) * 2 * kB;
      merge(std::integral_constant<int, 1>{}, r0, r0 + (warp % 2) * 8);
    }
    __syncthreads();  // 32x32 inverses complete
    if (warp < 4) merge(std::integral_constant<int, 2>{}, 0, warp * 8);  // 32-block (1, 0)
    __syncthreads();  // T complete
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
