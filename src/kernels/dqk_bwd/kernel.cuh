// dq, dk (output and state terms), dW and their part of dG (B6 of fla_reference.md §2.5):
// one CTA per (chunk, q/k head), looping over the head's G value heads hv in ascending order.
// Per value head, with h = its chunk-start state and dS' = the gradient of its chunk-end state:
//   dA     = causal(scale (dO Delta^T)_ij e^{G_i - G_j})   (i >= j)             [64 x 64]
//   dq    += scale e^{G_i} (dO h^T) + dA K                                       [64 x 128]
//   dk    += e^{G_last - G_j} (Delta dS'^T) + dA^T Q                             [64 x 128]
//   dW     = -dDelta h^T                                                         [64 x 128] bf16
//   dG_i   = <q_i, dq_i> - <k_i, dk_i>,  and at the last row + e^{G_last} <h, dS'>
//            + sum_j <k_j, dk_j^inter>                                (§2.4; WY terms in wy_bwd)
// where dG takes only this value head's terms of dq and dk. dq and dk are summed over the value
// heads in fp32 registers (each of the 8 warps owns one 32 x 32 tile of each) and written once per
// (chunk, q/k head) as fp32 [64 x 128]: dq complete, dk without its WY terms (wy_bwd stores those
// per value head, qk_grad adds them). Per value head they would cost 2 x 32 KB written per (chunk,
// value head) and read again later; q and k are loaded once for the G value heads.
// dG is formed without its exactly cancelling parts: the diagonal of dA enters <q_i, dq_i> and
// <k_i, dk_i> with opposite signs, and so does the last row's <k, dk^inter>. Summed in floating
// point they leave O(eps) residue, which swamps the true dg when the gates are strongly negative
// (g = -20: dg ~ e^-20). So the intra-chunk part is P_ij = dA_ij <q_i, k_j> summed over j < i
// (+ to row i, - to column j), and <q, dq>, <k, dk> take only the inter-chunk parts.
//   dG_i = e^{G_i} scale <q_i, h dO_i> + sum_{j<i} P_ij - sum_{i'>i} P_i'i
//          - [i<last] <k_i, dk_i^inter>
//          + [i=last] (e^{G_last} <h, dS'> + sum_{j<last} <k_j, dk_j^inter>)
// All products on the tensor cores (bf16 operands, fp32 accumulation); Q K^T once per CTA.
// Bitwise deterministic (a product promise): no atomics. The value heads add onto dq, dk in
// ascending order (per value head: its scaled first product, then its second product). The sums
// spread over warps (<h, dS'>, and the row sums <q, dq^inter>, <k, dk^inter> of the column tiles)
// go to one slot per warp or tile and are added in ascending slot order after a barrier (gemm.cuh,
// sum_parts).
// The next value head's tiles load while this one's second products (dA K, dA^T Q) and dG run:
// its Delta, dO, h, dS', dDelta and G are dead after the barrier that follows dW.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/dqk_bwd/params.hpp"

namespace cake::kernels::dqk_bwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kLdA = kChunk + 8;  // bf16 dA: 144-byte rows, ldmatrix conflict-free
// Warp tiles of the dq and dk products (2 x 4 mma tiles of 16 x 8): the [64 x 128] outputs are
// exactly 8 such tiles, one per warp, so the sums over value heads stay in registers. The row-sum
// partials they leave per row: one per column tile.
inline constexpr int kDotMi = 2;
inline constexpr int kDotNi = 4;
inline constexpr int kDotParts = kRowSumParts<kHeadDim, kDotNi>;

// About 200 KB: one CTA per SM. q, k, qk live for the whole CTA; the rest per value head.
struct SharedStorage {
  __nv_bfloat16 q[kChunk * kLdBf16];       // [64 x 128]
  __nv_bfloat16 k[kChunk * kLdBf16];       // [64 x 128]
  __nv_bfloat16 delta[kChunk * kLdBf16];   // [64 x 128]
  __nv_bfloat16 dout[kChunk * kLdBf16];    // [64 x 128]
  __nv_bfloat16 ddelta[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 h[kHeadDim * kLdBf16];     // [128 x 128]
  __nv_bfloat16 dh[kHeadDim * kLdBf16];    // [128 x 128]
  __nv_bfloat16 da[kChunk * kLdA];         // [64 x 64] bf16(dA)
  float qk[kChunk * kLd64];                // [64 x 64] Q K^T, shared by the value heads
  float p[kChunk * kLd64];                 // [64 x 64] P = dA (Q K^T)
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
  int const h = blockIdx.y;
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const group = p.problem.group_size();
  int const len = c.len;
  int const tid = threadIdx.x;
  float const scale = p.problem.scale;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  // Delta, dO, h, dS' (cp.async, committed with whatever is in flight), dDelta and G of value
  // head hv; the caller waits and syncs.
  auto const load_value_head = [&](int hv) {
    int64_t const row0 = c.t0 * HV + hv;  // (token t0, head hv) in [BT, HV]
    int64_t const state = (slot * HV + hv) * kHeadDim * kHeadDim;
    load_tile_async<kChunk, kHeadDim, kThreads>(s.delta, kLdBf16, p.v_new + row0 * kHeadDim,
                                                v_stride, len);
    load_tile_async<kChunk, kHeadDim, kThreads>(s.dout, kLdBf16, p.dout + row0 * kHeadDim,
                                                v_stride, len);
    load_tile_async<kHeadDim, kHeadDim, kThreads>(s.h, kLdBf16, p.h + state, kHeadDim, kHeadDim);
    load_tile_async<kHeadDim, kHeadDim, kThreads>(s.dh, kLdBf16, p.dh + state, kHeadDim,
                                                  kHeadDim);
    cp_async_commit();
    load_tile_f32_to_bf16<kChunk, kHeadDim, kThreads>(s.ddelta, kLdBf16,
                                                      p.dv_new + row0 * kHeadDim, v_stride, len);
    if (tid < kChunk) s.gcum[tid] = p.gcum[row0 + int64_t{tid < len ? tid : len - 1} * HV];
  };

  load_tile_async<kChunk, kHeadDim, kThreads>(s.q, kLdBf16, p.q + (c.t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_value_head(h * group);
  cp_async_wait<0>();
  __syncthreads();

  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.q, kLdBf16}, ColMajor{s.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
        *reinterpret_cast<float2*>(s.qk + i * kLd64 + j) = make_float2(c0, c1);
      });

  // This warp's tiles of dq and dk, summed over the value heads
  WarpTile const tile = owned_tile<kChunk, kHeadDim, kDotMi, kDotNi, kWarps>();
  float dq[kDotMi][kDotNi][4] = {};
  float dk[kDotMi][kDotNi][4] = {};

  for (int gi = 0; gi < group; ++gi) {
    int const hv = h * group + gi;
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

    // dA = causal(scale (dO Delta^T) e^{G_i - G_j}); P = dA (Q K^T), read on the thread that
    // wrote that element of Q K^T (same product shape, same owner)
    block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
        RowMajor{s.dout, kLdBf16}, ColMajor{s.delta, kLdBf16},
        [&](int i, int j, float c0, float c1) {
          float const g_i = s.gcum[i];
          float const da0 = i >= j ? scale * c0 * __expf(g_i - s.gcum[j]) : 0.f;
          float const da1 = i >= j + 1 ? scale * c1 * __expf(g_i - s.gcum[j + 1]) : 0.f;
          *reinterpret_cast<__nv_bfloat162*>(s.da + i * kLdA + j) =
              __floats2bfloat162_rn(da0, da1);
          float2 const qk = *reinterpret_cast<float2 const*>(s.qk + i * kLd64 + j);
          *reinterpret_cast<float2*>(s.p + i * kLd64 + j) =
              make_float2(i > j ? da0 * qk.x : 0.f, i > j + 1 ? da1 * qk.y : 0.f);
        });
    if (tid < kChunk) {
      s.q_scale[tid] = scale * __expf(s.gcum[tid]);
      s.k_scale[tid] = __expf(g_last - s.gcum[tid]);
    }
    __syncthreads();  // dA, P, h_dh partials, row scales complete
    if (tid < kChunk) {
      float row = 0.f;
      for (int j = 0; j < tid; ++j) row += s.p[tid * kLd64 + j];
      s.p_row[tid] = row;
    } else if (tid < 2 * kChunk) {
      int const j = tid - kChunk;
      float col = 0.f;
      for (int i = j + 1; i < kChunk; ++i) col += s.p[i * kLd64 + j];
      s.p_col[j] = col;
    }

    // The first products' mid step: row i scaled by row_scale[i], then its share of
    // <x_i, product_i> (x = q for dq, k for dk) returned for the row sums.
    auto scale_and_dot = [](float const* row_scale, __nv_bfloat16 const* x) {
      return [row_scale, x](int i, int col, float& c0, float& c1) {
        c0 *= row_scale[i];
        c1 *= row_scale[i];
        float2 const xi = __bfloat1622float2(
            *reinterpret_cast<__nv_bfloat162 const*>(x + i * kLdBf16 + col));
        return c0 * xi.x + c1 * xi.y;
      };
    };
    // dq += scale e^G (dO h^T), <q, dq^inter> summed per row before the add
    warp_tile_mma_mid_add<kChunk, kHeadDim>(RowMajor{s.dout, kLdBf16}, ColMajor{s.h, kLdBf16},
                                            tile, scale_and_dot(s.q_scale, s.q),
                                            &s.q_dq_parts[0][0], dq);
    // dk += e^{G_last - G_j} (Delta dS'^T), <k, dk^inter> summed per row before the add
    warp_tile_mma_mid_add<kChunk, kHeadDim>(RowMajor{s.delta, kLdBf16}, ColMajor{s.dh, kLdBf16},
                                            tile, scale_and_dot(s.k_scale, s.k),
                                            &s.k_dk_parts[0][0], dk);
    // dW = -dDelta h^T
    __nv_bfloat16* const dw = p.dw + (c.t0 * HV + hv) * kHeadDim;
    block_gemm<kChunk, kHeadDim, kHeadDim, 2, 4, kWarps>(
        RowMajor{s.ddelta, kLdBf16}, ColMajor{s.h, kLdBf16},
        [&](int i, int r, float c0, float c1) {
          if (i < len)
            *reinterpret_cast<__nv_bfloat162*>(dw + i * v_stride + r) =
                __floats2bfloat162_rn(-c0, -c1);
        });
    __syncthreads();  // Delta, dO, h, dS', dDelta, G, row scales dead; row-sum partials complete

    if (gi + 1 < group) load_value_head(hv + 1);
    // dq += dA K, dk += dA^T Q
    warp_tile_mma<kChunk, kDotMi, kDotNi>(RowMajor{s.da, kLdA}, RowMajor{s.k, kLdBf16}, tile.m0,
                                          tile.n0, dq);
    warp_tile_mma<kChunk, kDotMi, kDotNi>(ColMajor{s.da, kLdA}, RowMajor{s.q, kLdBf16}, tile.m0,
                                          tile.n0, dk);
    // The last row needs every row's <k, dk^inter>: sum the partials once, in tile order
    if (tid < kChunk) s.k_dk_inter[tid] = sum_parts<kChunk, kDotParts>(&s.k_dk_parts[0][0], tid);
    __syncthreads();  // <k, dk^inter> complete; dA no longer read

    if (tid < len) {
      float dg =
          sum_parts<kChunk, kDotParts>(&s.q_dq_parts[0][0], tid) + s.p_row[tid] - s.p_col[tid];
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
    cp_async_wait<0>();
    __syncthreads();  // the next value head's tiles complete; this one's sums no longer read
  }

  // dq and dk of the chunk's rows: [64 x 128] slices of the [BT, H, K] fp32 outputs
  auto const store_rows = [&](float* out, float (&acc)[kDotMi][kDotNi][4]) {
    for_each_acc_pair<kDotMi, kDotNi>(
        tile.m0, tile.n0, acc, [&](int i, int col, float& c0, float& c1) {
          if (i < len) *reinterpret_cast<float2*>(out + i * qk_stride + col) = make_float2(c0, c1);
        });
  };
  store_rows(p.dq_h + (c.t0 * H + h) * kHeadDim, dq);
  store_rows(p.dk_h + (c.t0 * H + h) * kHeadDim, dk);
#endif
}

}  // namespace cake::kernels::dqk_bwd
