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
// heads in fp32 registers and written once per (chunk, q/k head) as fp32 [64 x 128]: dq complete,
// dk without its WY terms (wy_bwd stores those per value head, qk_grad adds them). Per value head
// they would cost 2 x 32 KB written per (chunk, value head) and read again later; q and k are
// loaded once for the G value heads.
// dG is formed without its exactly cancelling parts: the diagonal of dA enters <q_i, dq_i> and
// <k_i, dk_i> with opposite signs, and so does the last row's <k, dk^inter>. Summed in floating
// point they leave O(eps) residue, which swamps the true dg when the gates are strongly negative
// (g = -20: dg ~ e^-20). So the intra-chunk part is P_ij = dA_ij <q_i, k_j> summed over j < i
// (+ to row i, - to column j), and <q, dq>, <k, dk> take only the inter-chunk parts.
//   dG_i = e^{G_i} scale <q_i, h dO_i> + sum_{j<i} P_ij - sum_{i'>i} P_i'i
//          - [i<last] <k_i, dk_i^inter>
//          + [i=last] (e^{G_last} <h, dS'> + sum_{j<last} <k_j, dk_j^inter>)
//
// Products: wgmma (bf16 operands in blocked shared tiles, common/wgmma.cuh; fp32 accumulators in
// registers), two warpgroups. Warpgroup 0 holds dq and warpgroup 1 dk, [64 x 128] each (64
// registers per thread) across the value heads, so that every product onto dq or dk is one
// warpgroup's m64n128 and the row sums <q, dq^inter>, <k, dk^inter> are complete within a quad.
// Q K^T, dO Delta^T (hence dA and P) and dW are split by columns: 32, 32 and 64 per warpgroup;
// Q K^T is recomputed per value head (8 small wgmma) rather than held across them. Why wgmma:
// with mma.sync (until v6) the kernel was bound by operand reads from shared memory (ldmatrix per
// 16 x 32 warp tile, ~0.85 MB per value head; 22.6 ms at workload A, and a quarter fewer DRAM
// bytes saved 5 %); wgmma reads each operand once per warpgroup (~0.3 MB per value head), which
// leaves DRAM as the bound (~145 KB per (chunk, value head), ~96 KB per (chunk, q/k head)).
// Operand majors, from how each tile is stored (rows = tokens or K / V dims, as in global memory):
// dO, Delta, dDelta, Q (of Q K^T) are K-major A; Delta, K, h and dS' K-major B of the products
// with their transposes; dA (warpgroup 0) and dA^T (warpgroup 1, written transposed next to dA)
// K-major A of dA K and dA^T Q, whose K and Q are N-major B. So both warpgroups issue the same
// instructions on different tiles.
// Per value head: wgmma groups {Q K^T, dO Delta^T} and {dDelta h^T} (dA, P and their sums while
// the second runs), then {dq^inter or dk^inter} (<h, dS'> while it runs), barrier, then {dA K or
// dA^T Q} (dG while it runs), barrier. The next value head's Delta, dO, h, dS' and G load after
// the first barrier, its fp32 dDelta a whole value head ahead into a staging tile that the
// copying threads convert to bf16 before the second.
// Bitwise deterministic (a product promise): no atomics. The value heads add onto dq, dk in
// ascending order (per value head: its scaled first product, then its second product). Sums over
// threads go through shuffles in a fixed order into one slot per warpgroup or warp, added in
// ascending slot order after a barrier (gemm.cuh, sum_parts): <q, dq^inter> and <k, dk^inter>
// (the quad of a row, one slot), P's row sums (the quad, one slot per warpgroup) and column sums
// (the 8 lanes of a column, one slot per warp of the column's warpgroup), <h, dS'> (one per warp).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"  // pack_bf16x2, sum_parts
#include "kernels/common/problem.hpp"
#include "kernels/common/wgmma.cuh"
#include "kernels/dqk_bwd/params.hpp"

namespace cake::kernels::dqk_bwd {

inline constexpr int kThreads = 256;  // two warpgroups
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kACols = kChunk / 2;    // columns of dO Delta^T (dA, P) per warpgroup
inline constexpr int kWCols = kHeadDim / 2;  // columns of dW per warpgroup
// fp32 dDelta staging rows: 528 bytes, so that its conversion reads conflict-free (below)
inline constexpr int kLdF32 = kHeadDim + 4;

// About 195 KB: one CTA per SM. q, k live for the whole CTA; the rest per value head.
struct SharedStorage {
  __nv_bfloat16 q[kChunk * kHeadDim];       // [64 x 128]
  __nv_bfloat16 k[kChunk * kHeadDim];       // [64 x 128]
  __nv_bfloat16 delta[kChunk * kHeadDim];   // [64 x 128]
  __nv_bfloat16 dout[kChunk * kHeadDim];    // [64 x 128]
  __nv_bfloat16 h[kHeadDim * kHeadDim];     // [128 x 128]
  __nv_bfloat16 dh[kHeadDim * kHeadDim];    // [128 x 128] dS'
  __nv_bfloat16 ddelta[kChunk * kHeadDim];  // [64 x 128] bf16(dDelta)
  __nv_bfloat16 da[kChunk * kChunk];        // [64 x 64] bf16(dA)
  __nv_bfloat16 dat[kChunk * kChunk];       // [64 x 64] bf16(dA)^T
  float ddelta_f32[kChunk * kLdF32];        // [64 x 128] the next value head's fp32 dDelta
  float gcum[kChunk];                       // G; rows past the end repeat G of the last token
  float inter_dot[2][kChunk];    // <q_i, dq_i^inter> (warpgroup 0), <k_i, dk_i^inter> (1)
  float p_row_parts[2][kChunk];  // sum_{j<i} P_ij, one partial per warpgroup
  float p_col_parts[4][kChunk];  // sum_{i>j} P_ij, one partial per warp of a warpgroup
  float h_dh[kWarps];            // <h, dS'>, one partial per warp
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "dqk_bwd shared memory exceeds 227 KB");

// The fp32 dDelta staging tile [64 x 128] is copied and converted piece by piece (16 bytes: row r,
// columns c .. c + 3) by the same thread, so the conversion needs only that thread's
// cp_async_wait, no barrier. Thread t takes rows t % 8 + 8 it (it = 0 .. 7) at columns
// 4 (t / 8) .. + 3: a warp copies 64 contiguous bytes (two sectors) of each of 8 rows per round.
// With kLdF32 rows the 8 lanes of a 16-byte phase read distinct banks (row r shifts by r x 16
// bytes), and the 16 lanes of an 8-byte phase write the 16 distinct 8-byte slots of one blocked
// core matrix (8 rows x 2 halves).
inline constexpr int kStagedRounds = kChunk / 8;
__device__ __forceinline__ int staged_row0() { return threadIdx.x % 8; }
__device__ __forceinline__ int staged_col() { return threadIdx.x / 8 * 4; }

// <a, b> over 8 bf16 pairs (16 bytes each), in element order.
__device__ __forceinline__ float dot8(uint4 const& a, uint4 const& b) {
  uint32_t const aw[4] = {a.x, a.y, a.z, a.w};
  uint32_t const bw[4] = {b.x, b.y, b.z, b.w};
  float sum = 0.f;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    float2 const x = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(&aw[t]));
    float2 const y = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(&bw[t]));
    sum += x.x * y.x + x.y * y.y;
  }
  return sum;
}

__global__ void __launch_bounds__(kThreads, 1) dqk_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char smem_raw[];
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
  int const warp = tid / 32;
  int const lane = tid % 32;
  int const wg = tid / 128;  // warpgroup: 0 holds dq, 1 holds dk
  float const scale = p.problem.scale;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  int const a_col0 = kACols * wg;  // this warpgroup's columns of dO Delta^T, dA, P
  int const w_col0 = kWCols * wg;  // ... and of dW
  // This thread's accumulator rows r_lo and r_lo + 8 (ptx.cuh, wgmma)
  int const r_lo = 16 * (warp % 4) + lane / 4;

  // Delta, dO, h, dS' and G of value head hv (cp.async, one group with whatever is in flight)
  auto const load_value_head = [&](int hv) {
    int64_t const row0 = c.t0 * HV + hv;  // (token t0, head hv) in [BT, HV]
    int64_t const state = (slot * HV + hv) * kHeadDim * kHeadDim;
    load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.delta, p.v_new + row0 * kHeadDim,
                                                        v_stride, len);
    load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.dout, p.dout + row0 * kHeadDim, v_stride,
                                                        len);
    load_tile_blocked_async<kHeadDim, kHeadDim, kThreads>(s.h, p.h + state, kHeadDim, kHeadDim);
    load_tile_blocked_async<kHeadDim, kHeadDim, kThreads>(s.dh, p.dh + state, kHeadDim, kHeadDim);
    if (tid < kChunk)  // past the end: G of the last token, so that no exponent there is large
      cp_async_4(&s.gcum[tid], p.gcum + row0 + int64_t{tid < len ? tid : len - 1} * HV, true);
    cp_async_commit();
  };
  // fp32 dDelta of value head hv -> ddelta_f32 (cp.async, this thread's pieces; rows past the end
  // zero)
  auto const stage_ddelta = [&](int hv) {
    float const* const src = p.dv_new + (c.t0 * HV + hv) * kHeadDim;
    float const* const from = src + staged_row0() * v_stride + staged_col();
    float* const to = s.ddelta_f32 + staged_row0() * kLdF32 + staged_col();
#pragma unroll
    for (int it = 0; it < kStagedRounds; ++it) {
      bool const ok = staged_row0() + 8 * it < len;
      cp_async_16(to + 8 * it * kLdF32, ok ? from + 8 * it * v_stride : src, ok);
    }
    cp_async_commit();
  };
  // ddelta <- bf16(ddelta_f32), this thread's pieces (after its cp_async_wait)
  auto const convert_ddelta = [&] {
    float const* const from = s.ddelta_f32 + staged_row0() * kLdF32 + staged_col();
    __nv_bfloat16* const to = s.ddelta + blocked_offset<kHeadDim>(staged_row0(), staged_col());
#pragma unroll
    for (int it = 0; it < kStagedRounds; ++it) {
      float4 const x = *reinterpret_cast<float4 const*>(from + 8 * it * kLdF32);
      *reinterpret_cast<uint2*>(to + it * kNext8Rows<kHeadDim>) =
          make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
    }
  };

  int const hv0 = h * group;
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.q, p.q + (c.t0 * H + h) * kHeadDim,
                                                      qk_stride, len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.k, p.k + (c.t0 * H + h) * kHeadDim,
                                                      qk_stride, len);
  load_value_head(hv0);
  stage_ddelta(hv0);
  cp_async_wait<0>();
  convert_ddelta();
  fence_proxy_async_shared();  // the tiles and bf16(dDelta) are read by wgmma (the async proxy)
  __syncthreads();             // q, k, the first value head's tiles and bf16(dDelta) visible

  // Warpgroup 0: dq, 1: dk ([64 x 128]), summed over the value heads. The same instructions
  // serve both; the operands differ.
  float acc[kHeadDim / 2] = {};
  __nv_bfloat16 const* const x_rows = wg == 0 ? s.q : s.k;  // <x_i, inter_i>: q for dq, k for dk
  KMajorTile<kHeadDim> const inter_a{wg == 0 ? s.dout : s.delta};  // dO h^T or Delta dS'^T
  KMajorTile<kHeadDim> const inter_b{wg == 0 ? s.h : s.dh};
  KMajorTile<kChunk> const intra_a{wg == 0 ? s.da : s.dat};  // dA K or dA^T Q
  MNMajorTile<kHeadDim> const intra_b{wg == 0 ? s.k : s.q};

  for (int gi = 0; gi < group; ++gi) {
    int const hv = hv0 + gi;
    // ddelta_f32's last reader was this thread's conversion, before the barrier above
    if (gi + 1 < group) stage_ddelta(hv + 1);
    float const g_last = s.gcum[len - 1];
    float const g_lo = s.gcum[r_lo];
    float const g_hi = s.gcum[r_lo + 8];

    // Q K^T and dO Delta^T (this warpgroup's 32 columns: P and dA) in one wgmma group, dDelta h^T
    // (its 64 columns of dW) in a second
    float qk[kACols / 2] = {};
    float sd[kACols / 2] = {};
    float dw[kWCols / 2] = {};
    fence_accumulators(qk, sd, dw);
    wgmma_fence();
    warpgroup_mma_async<kACols, kHeadDim>(KMajorTile<kHeadDim>{s.q}, KMajorTile<kHeadDim>{s.k}, 0,
                                          a_col0, qk);
    warpgroup_mma_async<kACols, kHeadDim>(KMajorTile<kHeadDim>{s.dout},
                                          KMajorTile<kHeadDim>{s.delta}, 0, a_col0, sd);
    wgmma_commit();
    warpgroup_mma_async<kWCols, kHeadDim>(KMajorTile<kHeadDim>{s.ddelta}, KMajorTile<kHeadDim>{s.h},
                                          0, w_col0, dw);
    wgmma_commit();
    wgmma_wait<1>();
    fence_accumulators(qk, sd);

    // While dW runs: dA = causal(scale (dO Delta^T) e^{G_i - G_j}) -> da, dat (bf16), and
    // P = dA (Q K^T) (i > j, fp32 dA) summed per row (this warpgroup's 32 columns: the quad, then
    // slot wg) and per column (this warp's 16 rows: the thread's two rows, then the 8 lanes of a
    // column, then slot warp % 4).
    float p_lo = 0.f;
    float p_hi = 0.f;
    // Element offsets at jb = 0 (column block jb adds 64 jb in da, 8 rows of dat per block)
    int const q2 = 2 * (lane % 4);
    int const da_at = blocked_offset<kChunk>(r_lo, a_col0 + q2);
    int const dat_at = blocked_offset<kChunk>(a_col0 + q2, r_lo);
#pragma unroll
    for (int jb = 0; jb < kACols / 8; ++jb) {
      int const j = a_col0 + 8 * jb + q2;
      float const g_j0 = s.gcum[j];
      float const g_j1 = s.gcum[j + 1];
      float const* const sv = &sd[4 * jb];  // (r_lo, j), (r_lo, j + 1), (r_lo + 8, j), (.., j + 1)
      // The exponentials of both triangles, then a select: no branches (above the diagonal they
      // may overflow to inf, which the select drops)
      float const e00 = __expf(g_lo - g_j0);
      float const e01 = __expf(g_lo - g_j1);
      float const e10 = __expf(g_hi - g_j0);
      float const e11 = __expf(g_hi - g_j1);
      float const da00 = r_lo >= j ? scale * sv[0] * e00 : 0.f;
      float const da01 = r_lo >= j + 1 ? scale * sv[1] * e01 : 0.f;
      float const da10 = r_lo + 8 >= j ? scale * sv[2] * e10 : 0.f;
      float const da11 = r_lo + 8 >= j + 1 ? scale * sv[3] * e11 : 0.f;
      __nv_bfloat16* const da = s.da + da_at + kNext8Cols * jb;
      *reinterpret_cast<__nv_bfloat162*>(da) = __floats2bfloat162_rn(da00, da01);
      *reinterpret_cast<__nv_bfloat162*>(da + kNext8Rows<kChunk>) =
          __floats2bfloat162_rn(da10, da11);
      __nv_bfloat16* const dat = s.dat + dat_at + kNext8Rows<kChunk> * jb;
      dat[0] = __float2bfloat16_rn(da00);
      dat[8] = __float2bfloat16_rn(da01);
      dat[kNext8Cols] = __float2bfloat16_rn(da10);
      dat[kNext8Cols + 8] = __float2bfloat16_rn(da11);
      float const* const qv = &qk[4 * jb];
      float const p00 = r_lo > j ? da00 * qv[0] : 0.f;
      float const p01 = r_lo > j + 1 ? da01 * qv[1] : 0.f;
      float const p10 = r_lo + 8 > j ? da10 * qv[2] : 0.f;
      float const p11 = r_lo + 8 > j + 1 ? da11 * qv[3] : 0.f;
      p_lo += p00 + p01;
      p_hi += p10 + p11;
      float const col0 = column_sum(p00 + p10);
      float const col1 = column_sum(p01 + p11);
      if (lane < 4) {
        s.p_col_parts[warp % 4][j] = col0;
        s.p_col_parts[warp % 4][j + 1] = col1;
      }
    }
    p_lo = quad_sum(p_lo);
    p_hi = quad_sum(p_hi);
    if (lane % 4 == 0) {
      s.p_row_parts[wg][r_lo] = p_lo;
      s.p_row_parts[wg][r_lo + 8] = p_hi;
    }
    wgmma_wait<0>();
    fence_accumulators(dw);

    // dW = -dDelta h^T -> dw (bf16 [BT, HV, K])
    __nv_bfloat16* const dw_out = p.dw + (c.t0 * HV + hv) * kHeadDim;
    for_each_wgmma_pair<kWCols>(0, w_col0, dw, [&](int i, int col, float& c0, float& c1) {
      if (i < len)
        *reinterpret_cast<__nv_bfloat162*>(dw_out + i * v_stride + col) =
            __floats2bfloat162_rn(-c0, -c1);
    });

    // dq^inter = dO h^T (warpgroup 0) or dk^inter = Delta dS'^T (1), all 128 columns
    float inter[kHeadDim / 2] = {};
    fence_accumulators(inter);
    wgmma_fence();
    warpgroup_mma_async<kHeadDim, kHeadDim>(inter_a, inter_b, 0, 0, inter);
    wgmma_commit();
    {  // <h, dS'> while it runs: h and dS' share the blocked layout, so element by element
      float part = 0.f;
#pragma unroll 2
      for (int idx = tid; idx < kHeadDim * kHeadDim / 8; idx += kThreads)
        part += dot8(*reinterpret_cast<uint4 const*>(s.h + 8 * idx),
                     *reinterpret_cast<uint4 const*>(s.dh + 8 * idx));
      for (int d = 16; d > 0; d /= 2) part += __shfl_xor_sync(0xffffffffu, part, d);
      if (lane == 0) s.h_dh[warp] = part;  // summed in warp order in dG
    }
    wgmma_wait<0>();
    fence_accumulators(inter);

    // acc += row scale x inter (scale e^{G_i} for dq, e^{G_last - G_i} for dk), and the row sums
    // <x_i, row scale x inter_i> (the quad's lanes hold a whole row)
    {
      float const rs_lo = wg == 0 ? scale * __expf(g_lo) : __expf(g_last - g_lo);
      float const rs_hi = wg == 0 ? scale * __expf(g_hi) : __expf(g_last - g_hi);
      float dot_lo = 0.f;
      float dot_hi = 0.f;
      __nv_bfloat16 const* const x_lo = x_rows + blocked_offset<kHeadDim>(r_lo, 2 * (lane % 4));
#pragma unroll
      for (int jb = 0; jb < kHeadDim / 8; ++jb) {
        float2 const xl =
            __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(x_lo + kNext8Cols * jb));
        float2 const xh = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(
            x_lo + kNext8Rows<kHeadDim> + kNext8Cols * jb));
        float const t0 = inter[4 * jb] * rs_lo;
        float const t1 = inter[4 * jb + 1] * rs_lo;
        float const t2 = inter[4 * jb + 2] * rs_hi;
        float const t3 = inter[4 * jb + 3] * rs_hi;
        dot_lo += t0 * xl.x + t1 * xl.y;
        dot_hi += t2 * xh.x + t3 * xh.y;
        acc[4 * jb] += t0;
        acc[4 * jb + 1] += t1;
        acc[4 * jb + 2] += t2;
        acc[4 * jb + 3] += t3;
      }
      dot_lo = quad_sum(dot_lo);
      dot_hi = quad_sum(dot_hi);
      if (lane % 4 == 0) {
        s.inter_dot[wg][r_lo] = dot_lo;
        s.inter_dot[wg][r_lo + 8] = dot_hi;
      }
    }
    fence_proxy_async_shared();  // da, dat are read by wgmma
    // dA, dA^T and every partial sum complete; Delta, dO, h, dS', bf16(dDelta) and G dead (both
    // warpgroups waited for their products)
    __syncthreads();

    if (gi + 1 < group) load_value_head(hv + 1);
    // acc += dA K (warpgroup 0) or dA^T Q (1)
    fence_accumulators(acc);
    wgmma_fence();
    warpgroup_mma_async<kHeadDim, kChunk>(intra_a, intra_b, 0, 0, acc);
    wgmma_commit();

    // dG of this value head while it runs (reads only the sums)
    if (tid < len) {
      float dg = s.inter_dot[0][tid] + sum_parts<kChunk, 2>(&s.p_row_parts[0][0], tid) -
                 sum_parts<kChunk, 4>(&s.p_col_parts[0][0], tid);
      if (tid < len - 1) {
        dg -= s.inter_dot[1][tid];
      } else {
        float inter_sum = 0.f;
        for (int j = 0; j < len - 1; ++j) inter_sum += s.inter_dot[1][j];
        dg += __expf(g_last) * sum_parts<1, kWarps>(s.h_dh, 0) + inter_sum;
      }
      p.dg_part[(c.t0 + tid) * HV + hv] = dg;
    }
    __syncwarp();  // wgmma.wait_group is .aligned: the warp reconverged after the rows' branch
    wgmma_wait<0>();
    fence_accumulators(acc);

    if (gi + 1 < group) {
      cp_async_wait<0>();
      // ddelta's last reader (dDelta h^T) finished before the barrier above
      convert_ddelta();
      fence_proxy_async_shared();
      // The next value head's tiles and bf16(dDelta) visible; dA, dA^T and the sums no longer
      // read
      __syncthreads();
    }
  }

  // dq (warpgroup 0) or dk (1) of the chunk's rows: [64 x 128] slices of the [BT, H, K] fp32
  // outputs
  float* const out = (wg == 0 ? p.dq_h : p.dk_h) + (c.t0 * H + h) * kHeadDim;
  for_each_wgmma_pair<kHeadDim>(0, 0, acc, [&](int i, int col, float& c0, float& c1) {
    if (i < len) *reinterpret_cast<float2*>(out + i * qk_stride + col) = make_float2(c0, c1);
  });
#endif
}

}  // namespace cake::kernels::dqk_bwd
