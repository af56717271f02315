// dq, dk (output and state terms), dW and their part of dG (B6 of fla_reference.md §2.5):
// one CTA per (chunk, value head), h = chunk-start state, dS' = gradient of the chunk-end state.
//   dA     = causal(scale (dO Delta^T)_ij e^{G_i - G_j})   (i >= j)             [64 x 64]
//   dq     = scale e^{G_i} (dO h^T) + dA K                                       [64 x 128] (final)
//   dk     = e^{G_last - G_j} (Delta dS'^T) + dA^T Q                 [64 x 128] (partial)
//   dW     = -dDelta h^T                                                         [64 x 128] bf16
//   dG_i   = <q_i, dq_i> - <k_i, dk_i>,  and at the last row + e^{G_last} <h, dS'>
//            + sum_j <k_j, dk_j^inter>                                (§2.4; WY terms in wy_bwd)
// dG is formed without its exactly cancelling parts: the diagonal of dA enters <q_i, dq_i> and
// <k_i, dk_i> with opposite signs, and so does the last row's <k, dk^inter>. Summed in floating
// point they leave O(eps) residue, which swamps the true dg when the gates are strongly negative
// (g = -20: dg ~ e^-20). So the intra-chunk part is P_ij = dA_ij <q_i, k_j> summed over j < i
// (+ to row i, - to column j), and <q, dq>, <k, dk> take only the inter-chunk parts.
//   dG_i = e^{G_i} scale <q_i, h dO_i> + sum_{j<i} P_ij - sum_{i'>i} P_i'i
//          - [i<last] <k_i, dk_i^inter>
//          + [i=last] (e^{G_last} <h, dS'> + sum_{j<last} <k_j, dk_j^inter>)
// All products on the tensor cores (bf16 operands, fp32 accumulation); dq, dk stay fp32 per value
// head until qk_grad sums the value heads of each q/k head.
// Bitwise deterministic (a product promise): no atomics. The sums spread over warps (<h, dS'>, and
// the row sums <q, dq^inter>, <k, dk^inter> of the column tiles) go to one slot per warp or tile
// and are added in ascending slot order after a barrier (gemm.cuh, sum_parts).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/dqk_bwd/params.hpp"

namespace cake::kernels::dqk_bwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kLdA = kChunk + 8;  // bf16 dA: 144-byte rows, ldmatrix conflict-free
// Warp tiles of the dq and dk products (2 x 4 mma tiles of 16 x 8) and the row-sum partials they
// leave per row: one per column tile.
inline constexpr int kDotMi = 2;
inline constexpr int kDotNi = 4;
inline constexpr int kDotParts = kRowSumParts<kHeadDim, kDotNi>;

struct SharedStorage {
  __nv_bfloat16 q[kChunk * kLdBf16];       // [64 x 128]
  __nv_bfloat16 k[kChunk * kLdBf16];       // [64 x 128]
  __nv_bfloat16 delta[kChunk * kLdBf16];   // [64 x 128]
  __nv_bfloat16 dout[kChunk * kLdBf16];    // [64 x 128]
  __nv_bfloat16 ddelta[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 h[kHeadDim * kLdBf16];     // [128 x 128]
  __nv_bfloat16 dh[kHeadDim * kLdBf16];    // [128 x 128]
  __nv_bfloat16 da[kChunk * kLdA];         // [64 x 64] bf16(dA)
  float qk[kChunk * kLd64];                // [64 x 64] Q K^T, then P = dA (Q K^T)
  float gcum[kChunk];
  float q_scale[kChunk];                   // scale e^{G_i}
  float k_scale[kChunk];                   // e^{G_last - G_i}
  float q_dq_parts[kDotParts][kChunk];     // <q_i, dq_i^inter>, one partial per column tile
  float k_dk_parts[kDotParts][kChunk];     // <k_i, dk_i^inter>, one partial per column tile
  float k_dk_inter[kChunk];                // <k_i, dk_i^inter>, the partials summed
  float p_row[kChunk];                     // sum_{j<i} P_ij
  float p_col[kChunk];                     // sum_{i>j} P_ij
  float h_dh[kWarps];                      // <h, dS'>, one partial per warp
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "dqk_bwd shared memory exceeds 227 KB");

__global__ void __launch_bounds__(kThreads) dqk_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  int64_t const slot = blockIdx.x;
  ChunkRef c;
  if (!find_chunk(p.problem, slot, c)) return;
  int const hv = blockIdx.y;
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const h = hv / p.problem.group_size();
  int const len = c.len;
  int const tid = threadIdx.x;
  float const scale = p.problem.scale;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  int64_t const state = (slot * HV + hv) * kHeadDim * kHeadDim;

  load_tile_async<kChunk, kHeadDim, kThreads>(s.q, kLdBf16, p.q + (c.t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(
      s.delta, kLdBf16, p.v_new + (c.t0 * HV + hv) * kHeadDim, v_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(
      s.dout, kLdBf16, p.dout + (c.t0 * HV + hv) * kHeadDim, v_stride, len);
  load_tile_async<kHeadDim, kHeadDim, kThreads>(s.h, kLdBf16, p.h + state, kHeadDim,
                                                kHeadDim);
  load_tile_async<kHeadDim, kHeadDim, kThreads>(s.dh, kLdBf16, p.dh + state, kHeadDim,
                                                kHeadDim);
  cp_async_commit();
  load_tile_f32_to_bf16<kChunk, kHeadDim, kThreads>(
      s.ddelta, kLdBf16, p.dv_new + (c.t0 * HV + hv) * kHeadDim, v_stride, len);
  if (tid < kChunk) {
    s.gcum[tid] = p.gcum[(c.t0 + (tid < len ? tid : len - 1)) * HV + hv];
  }
  cp_async_wait<0>();
  __syncthreads();
  float const g_last = s.gcum[len - 1];
  {
    float part = 0.f;
    for (int idx = tid; idx < kHeadDim * kHeadDim / 2; idx += kThreads) {
      int const r = idx / (kHeadDim / 2);
      int const col = (idx % (kHeadDim / 2)) * 2;
      float2 const a = __bfloat1622float2(
          *reinterpret_cast<__nv_bfloat162 const*>(s.h + r * kLdBf16 + col));
      float2 const b = __bfloat1622float2(
          *reinterpret_cast<__nv_bfloat162 const*>(s.dh + r * kLdBf16 + col));
      part += a.x * b.x + a.y * b.y;
    }
    for (int d = 16; d > 0; d /= 2) part += __shfl_xor_sync(0xffffffffu, part, d);
    if (tid % 32 == 0) s.h_dh[tid / 32] = part;  // summed in warp order at the end
  }

  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.q, kLdBf16}, ColMajor{s.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
        *reinterpret_cast<float2*>(s.qk + i * kLd64 + j) = make_float2(c0, c1);
      });
  // dA = causal(scale (dO Delta^T) e^{G_i - G_j}); P = dA (Q K^T) on the same owner thread
  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.dout, kLdBf16}, ColMajor{s.delta, kLdBf16},
      [&](int i, int j, float c0, float c1) {
        float const gi = s.gcum[i];
        float const da0 = i >= j ? scale * c0 * __expf(gi - s.gcum[j]) : 0.f;
        float const da1 = i >= j + 1 ? scale * c1 * __expf(gi - s.gcum[j + 1]) : 0.f;
        *reinterpret_cast<__nv_bfloat162*>(s.da + i * kLdA + j) = __floats2bfloat162_rn(da0, da1);
        float2* const qk2 = reinterpret_cast<float2*>(s.qk + i * kLd64 + j);
        float2 const qk = *qk2;
        *qk2 = make_float2(i > j ? da0 * qk.x : 0.f, i > j + 1 ? da1 * qk.y : 0.f);
      });
  if (tid < kChunk) {
    s.q_scale[tid] = scale * __expf(s.gcum[tid]);
    s.k_scale[tid] = __expf(g_last - s.gcum[tid]);
  }
  __syncthreads();  // dA, P, h_dh partials, row scales complete
  if (tid < kChunk) {
    float row = 0.f;
    for (int j = 0; j < tid; ++j) row += s.qk[tid * kLd64 + j];
    s.p_row[tid] = row;
  } else if (tid < 2 * kChunk) {
    int const j = tid - kChunk;
    float col = 0.f;
    for (int i = j + 1; i < kChunk; ++i) col += s.qk[i * kLd64 + j];
    s.p_col[j] = col;
  }

  float* const dq = p.dq_hv + (c.t0 * HV + hv) * kHeadDim;
  float* const dk = p.dk_hv + (c.t0 * HV + hv) * kHeadDim;
  // dq = scale e^G (dO h^T) + dA K; <q, dq^inter> summed between the two products
  block_gemm_mid<kChunk, kHeadDim, kHeadDim, kChunk, kDotMi, kDotNi, kWarps>(
      RowMajor{s.dout, kLdBf16}, ColMajor{s.h, kLdBf16},
      [&](int i, int col, float& c0, float& c1) {
        c0 *= s.q_scale[i];
        c1 *= s.q_scale[i];
        float2 const q = __bfloat1622float2(
            *reinterpret_cast<__nv_bfloat162 const*>(s.q + i * kLdBf16 + col));
        return c0 * q.x + c1 * q.y;
      },
      &s.q_dq_parts[0][0], RowMajor{s.da, kLdA}, RowMajor{s.k, kLdBf16},
      [&](int i, int col, float c0, float c1) {
        if (i < len) *reinterpret_cast<float2*>(dq + i * v_stride + col) = make_float2(c0, c1);
      });
  // dk = e^{G_last - G_j} (Delta dS'^T) + dA^T Q; <k, dk^inter> summed between the two products
  block_gemm_mid<kChunk, kHeadDim, kHeadDim, kChunk, kDotMi, kDotNi, kWarps>(
      RowMajor{s.delta, kLdBf16}, ColMajor{s.dh, kLdBf16},
      [&](int j, int r, float& c0, float& c1) {
        c0 *= s.k_scale[j];
        c1 *= s.k_scale[j];
        float2 const k = __bfloat1622float2(
            *reinterpret_cast<__nv_bfloat162 const*>(s.k + j * kLdBf16 + r));
        return c0 * k.x + c1 * k.y;
      },
      &s.k_dk_parts[0][0], ColMajor{s.da, kLdA}, RowMajor{s.q, kLdBf16},
      [&](int j, int r, float c0, float c1) {
        if (j < len) *reinterpret_cast<float2*>(dk + j * v_stride + r) = make_float2(c0, c1);
      });
  // dW = -dDelta h^T
  __nv_bfloat16* const dw = p.dw + (c.t0 * HV + hv) * kHeadDim;
  block_gemm<kChunk, kHeadDim, kHeadDim, 2, 4, kWarps>(
      RowMajor{s.ddelta, kLdBf16}, ColMajor{s.h, kLdBf16}, [&](int i, int r, float c0, float c1) {
        if (i < len)
          *reinterpret_cast<__nv_bfloat162*>(dw + i * v_stride + r) =
              __floats2bfloat162_rn(-c0, -c1);
      });
  __syncthreads();  // row-sum partials complete
  // The last row needs every row's <k, dk^inter>: sum the partials once, in tile order
  if (tid < kChunk) s.k_dk_inter[tid] = sum_parts<kChunk, kDotParts>(&s.k_dk_parts[0][0], tid);
  __syncthreads();  // <k, dk^inter> complete

  if (tid < len) {
    float dg = sum_parts<kChunk, kDotParts>(&s.q_dq_parts[0][0], tid) + s.p_row[tid] - s.p_col[tid];
    if (tid < len - 1) {
      dg -= s.k_dk_inter[tid];
    } else {
      float inter = 0.f;
      for (int j = 0; j < len - 1; ++j) inter += s.k_dk_inter[j];
      float const h_dh = sum_parts<1, kWarps>(s.h_dh, 0);
      dg += __expf(g_last) * h_dh + inter;
    }
    p.dg_part[(c.t0 + tid) * HV + hv] = dg;
  }
#endif
}

}  // namespace cake::kernels::dqk_bwd
