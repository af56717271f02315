// WY-representation backward (B7 of fla_reference.md §2.5, plus the gate's reverse cumsum):
// one CTA per (chunk, value head), the value heads fastest (below). With X = diag(beta) (K e^G),
// Y = diag(beta) V, W = T X, U = T Y:
//   dT   = dW X^T + dU Y^T                       [64 x 64]
//   dX   = T^T dW,  dY = T^T dU                  [64 x 128]
//   dv   = beta dY
//   dL   = -T^T dT T^T  (strictly lower),  M_ij = dL_ij e^{G_i - G_j},  R_ij = M_ij <k_i, k_j>
//   dk^WY_i = beta_i e^{G_i} dX_i + sum_j (beta_i M_ij + beta_j M_ji) k_j   [64 x 128] fp32
//   dbeta_i = <dY_i, v_i> + e^{G_i} <dX_i, k_i> + sum_j R_ij
//   dG_i  = dG_part_i + beta_i e^{G_i} <dX_i, k_i> + beta_i sum_j R_ij - sum_j beta_j R_ji
//   dg_t  = sum_{r >= t in the chunk} dG_r       (the cumsum's backward)
// dk^WY, this value head's WY terms of dk, is stored on its own (fp32 per value head); qk_grad
// adds the value heads' terms onto dqk_bwd's dk (output/state terms, already summed over the
// value heads), so no read-modify-write of a per-value-head dk.
// Since M is strictly lower, Sym = diag(beta) M + (diag(beta) M)^T (the matrix of dk^WY's second
// term) has one nonzero term per element: Sym_ij = Sym_ji = beta_i M_ij for i > j, 0 on the
// diagonal. It is written in M's epilogue, both halves at once; M itself is never stored.
//
// Products: wgmma (bf16 operands in blocked shared tiles, common/wgmma.cuh; fp32 accumulators in
// registers), two warpgroups, each taking half the columns of every product: 32 of the [64 x 64]
// ones (dT, K K^T, dT T^T, dL), 64 of the [64 x 128] ones (dY, dX, dk^WY). So both warpgroups
// issue the same instructions on different columns, and each thread holds the same elements of
// K K^T and of dL: R is formed in registers. Why wgmma: with mma.sync this kernel was bound by
// operand reads from shared memory (ldmatrix per warp tile, up to ~384 bytes per 16x8x16 product;
// 18.0 ms at workload A, barely moved when its DRAM bytes fell by a quarter); wgmma reads each
// operand once per warpgroup, which leaves DRAM (~144 KB per CTA) as the bound.
// Operand majors, from how each tile is stored (rows = tokens, as in global memory; T as its rows):
//   dW K^T, dU V^T, K K^T:  dW, dU, K K-major A; K, V, K K-major B
//   dY = T^T dU, dX = T^T dW:  T M-major A; dU, dW N-major B
//   dT T^T:  dT K-major A, T K-major B;   dL = -T^T (dT T^T):  T M-major A, dT T^T N-major B
//   Sym K:  Sym K-major A, K N-major B
// Schedule (wgmma groups in braces, barriers B1..B4 after B0, the loads):
//   {dW K^T, dU V^T} {K K^T, T^T dU}; dT -> dt (while the second group runs); B1
//   {dT T^T}; dv, <dY, v> while it runs; dT T^T -> dt_tt; B2
//   {T^T dT T^T} {T^T dW}; M, R and its sums, Sym -> sym (while the second runs);
//   e^G <dX, k>, dX *= beta e^G; B3
//   {dX += Sym K}; dbeta and dG rows while it runs; dk^WY out; B4; dg = reverse cumsum of dG.
// Bitwise deterministic (a product promise): no atomics. The row sums <dY, v>, e^G <dX, k> and
// sum_j R_ij go through the 4 lanes of a quad into one slot per warpgroup, the column sums
// sum_i beta_i R_ij through the 8 lane groups of a warp into one slot per warp; the slots are
// added in ascending order after a barrier (gemm.cuh, sum_parts).
// Rounding: the products' operands are bf16 (T and dU rounded as loaded, dT, dT T^T, Sym rounded
// once from fp32 beta_i M_ij); K K^T and M stay fp32 for R, as neither is stored.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"  // pack_bf16x2, sum_parts
#include "kernels/common/problem.hpp"
#include "kernels/common/tile.cuh"  // load_scalar
#include "kernels/common/wgmma.cuh"
#include "kernels/wy_bwd/params.hpp"

namespace cake::kernels::wy_bwd {

inline constexpr int kThreads = 256;         // two warpgroups
inline constexpr int kSCols = kChunk / 2;    // columns of the [64 x 64] products per warpgroup
inline constexpr int kVCols = kHeadDim / 2;  // columns of the [64 x 128] products per warpgroup

// 101,888 bytes, so that two CTAs share an SM and one's loads overlap the other's products. Each
// tile is written once, so no buffer is reused: k, v, dw, du and t by the loads (before B0), dt,
// dt_tt and sym each by one epilogue and read by wgmma only after the barrier that follows it
// (B1, B2, B3; fence_proxy_async_shared before each, as wgmma reads through the async proxy).
struct SharedStorage {
  __nv_bfloat16 k[kChunk * kHeadDim];    // [64 x 128]
  __nv_bfloat16 v[kChunk * kHeadDim];    // [64 x 128]
  __nv_bfloat16 dw[kChunk * kHeadDim];   // [64 x 128]
  __nv_bfloat16 du[kChunk * kHeadDim];   // [64 x 128] bf16(dU)
  __nv_bfloat16 t[kChunk * kChunk];      // [64 x 64] bf16(T)
  __nv_bfloat16 dt[kChunk * kChunk];     // [64 x 64] bf16(dT)
  __nv_bfloat16 dt_tt[kChunk * kChunk];  // [64 x 64] bf16(dT T^T)
  __nv_bfloat16 sym[kChunk * kChunk];    // [64 x 64] bf16(Sym), symmetric
  float gcum[kChunk];                    // G; rows past the end repeat G of the last token
  float beta[kChunk];                    // 0 past the end
  float eg[kChunk];                      // e^{G_i}
  float y_dot[2][kChunk];                // <dY_i, v_i>, one partial per warpgroup (64 columns)
  float x_dot[2][kChunk];                // e^{G_i} <dX_i, k_i>, likewise
  float r_row[2][kChunk];                // sum_j R_ij, one partial per warpgroup (32 columns j)
  float r_col[4][kChunk];                // sum_i beta_i R_ij, one per warp (16 rows i)
  float dgc[kChunk];                     // dG_i
};
static_assert(sizeof(SharedStorage) <= 113 * 1024, "wy_bwd must fit two CTAs per SM");

// An fp32 [kRows x kCols] tile of global memory (row-major) on its way to a blocked bf16 tile:
// load() issues this thread's 16-byte loads (rows at or past `valid` zero), store_bf16() rounds
// them to bf16 (nearest) and writes them at their blocked offsets; two steps, so that the loads
// of several tiles are in flight together. Thread t takes rows t % 8 + 8 (t / (8 kVecs)) + kStep it
// at columns 4 ((t / 8) % kVecs) .. + 3: per round a warp reads 64 contiguous bytes of each of 8
// rows and writes two whole core matrices (256 contiguous bytes), without bank conflicts.
template <int kRows, int kCols>
struct F32Tile {
  static constexpr int kVecs = kCols / 4;         // 16-byte vectors per row
  static constexpr int kStep = kThreads / kVecs;  // rows per round
  static constexpr int kRounds = kRows / kStep;
  static_assert(kStep % 8 == 0 && kRows % kStep == 0, "rounds of whole core-matrix rows");
  float4 x[kRounds];

  __device__ __forceinline__ static int row0() {
    return threadIdx.x % 8 + threadIdx.x / (8 * kVecs) * 8;
  }
  __device__ __forceinline__ static int col() { return threadIdx.x / 8 % kVecs * 4; }

  __device__ __forceinline__ void load(float const* src, int64_t row_stride, int valid) {
#pragma unroll
    for (int it = 0; it < kRounds; ++it) {
      int const r = row0() + kStep * it;  // addresses formed only for rows in the tensor
      x[it] = r < valid ? *reinterpret_cast<float4 const*>(src + r * row_stride + col())
                        : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __device__ __forceinline__ void store_bf16(__nv_bfloat16* dst) const {
    __nv_bfloat16* const to = dst + blocked_offset<kCols>(row0(), col());
#pragma unroll
    for (int it = 0; it < kRounds; ++it)
      *reinterpret_cast<uint2*>(to + it * (kStep / 8) * kNext8Rows<kCols>) =
          make_uint2(pack_bf16x2(x[it].x, x[it].y), pack_bf16x2(x[it].z, x[it].w));
  }
};

__global__ void __launch_bounds__(kThreads, 2) wy_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  // blockIdx.x = slot HV + hv: the value heads of a chunk run together, so the G value heads of a
  // q/k head read K once from DRAM (then L2), and neighbouring CTAs read neighbouring rows of the
  // [BT, HV, .] tensors.
  int const HV = p.problem.num_v_heads;
  int const hv = static_cast<int>(blockIdx.x % HV);
  ChunkRef c;
  if (!find_chunk(p.problem, blockIdx.x / HV, c)) return;
  int const H = p.problem.num_qk_heads;
  int const h = hv / p.problem.group_size();
  int const len = c.len;
  int const tid = threadIdx.x;
  int const warp = tid / 32;
  int const lane = tid % 32;
  int const wg = tid / 128;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  int64_t const row0 = c.t0 * HV + hv;  // (token t0, head hv) in [BT, HV]
  int const s_col0 = kSCols * wg;       // this warpgroup's columns of the [64 x 64] products
  int const v_col0 = kVCols * wg;       // ... and of the [64 x 128] ones
  // This thread's accumulator rows r_lo and r_lo + 8 (ptx.cuh, wgmma) and first column in a block
  int const r_lo = 16 * (warp % 4) + lane / 4;
  int const r_hi = r_lo + 8;
  int const q2 = 2 * (lane % 4);

  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.k, p.k + (c.t0 * H + h) * kHeadDim,
                                                      int64_t{H} * kHeadDim, len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.v, p.v + row0 * kHeadDim, v_stride, len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.dw, p.dw + row0 * kHeadDim, v_stride, len);
  cp_async_commit();
  F32Tile<kChunk, kHeadDim> du;
  F32Tile<kChunk, kChunk> t;
  du.load(p.dv_new + row0 * kHeadDim, v_stride, len);
  t.load(p.tmat + row0 * kChunk, int64_t{HV} * kChunk, len);
  if (tid < kChunk) {
    int64_t const row = (c.t0 + (tid < len ? tid : len - 1)) * HV + hv;
    s.gcum[tid] = p.gcum[row];
    s.eg[tid] = __expf(s.gcum[tid]);
    s.beta[tid] = tid < len ? load_scalar(p.beta, row, p.beta_is_bf16) : 0.f;
  }
  du.store_bf16(s.du);
  t.store_bf16(s.t);
  cp_async_wait<0>();
  fence_proxy_async_shared();  // the tiles are read by wgmma (the async proxy)
  __syncthreads();             // B0: k, v, dw, du, t, G, beta visible

  // {dW K^T, dU V^T} and {K K^T, T^T dU}: this warpgroup's columns of dT's two terms, of K K^T
  // (kept in registers for R) and of dY
  float dwk[kSCols / 2] = {};
  float duv[kSCols / 2] = {};
  float kk[kSCols / 2] = {};
  float dy[kVCols / 2] = {};
  fence_accumulators(dwk, duv, kk, dy);
  wgmma_fence();
  warpgroup_mma_async<kSCols, kHeadDim>(KMajorTile<kHeadDim>{s.dw}, KMajorTile<kHeadDim>{s.k}, 0,
                                        s_col0, dwk);
  warpgroup_mma_async<kSCols, kHeadDim>(KMajorTile<kHeadDim>{s.du}, KMajorTile<kHeadDim>{s.v}, 0,
                                        s_col0, duv);
  wgmma_commit();
  warpgroup_mma_async<kSCols, kHeadDim>(KMajorTile<kHeadDim>{s.k}, KMajorTile<kHeadDim>{s.k}, 0,
                                        s_col0, kk);
  warpgroup_mma_async<kVCols, kChunk>(MNMajorTile<kChunk>{s.t}, MNMajorTile<kHeadDim>{s.du}, 0,
                                      v_col0, dy);
  wgmma_commit();
  wgmma_wait<1>();
  fence_accumulators(dwk, duv);

  // dT_ij = beta_j (e^{G_j} (dW K^T)_ij + (dU V^T)_ij) -> dt (bf16)
  {
    int const at = blocked_offset<kChunk>(r_lo, s_col0 + q2);  // column block jb adds 64 jb
#pragma unroll
    for (int jb = 0; jb < kSCols / 8; ++jb) {
      int const j = s_col0 + 8 * jb + q2;
      float const b0 = s.beta[j];
      float const b1 = s.beta[j + 1];
      float const e0 = s.eg[j];
      float const e1 = s.eg[j + 1];
      float const* const x = &dwk[4 * jb];  // (r_lo, j), (r_lo, j + 1), (r_hi, j), (r_hi, j + 1)
      float const* const y = &duv[4 * jb];
      __nv_bfloat16* const d = s.dt + at + kNext8Cols * jb;
      *reinterpret_cast<__nv_bfloat162*>(d) =
          __floats2bfloat162_rn(b0 * (e0 * x[0] + y[0]), b1 * (e1 * x[1] + y[1]));
      *reinterpret_cast<__nv_bfloat162*>(d + kNext8Rows<kChunk>) =
          __floats2bfloat162_rn(b0 * (e0 * x[2] + y[2]), b1 * (e1 * x[3] + y[3]));
    }
  }
  fence_proxy_async_shared();  // dt is read by wgmma
  __syncthreads();             // B1: dT complete

  // {dT T^T}, this warpgroup's columns
  float dt_tt[kSCols / 2] = {};
  fence_accumulators(dt_tt);
  wgmma_fence();
  warpgroup_mma_async<kSCols, kChunk>(KMajorTile<kChunk>{s.dt}, KMajorTile<kChunk>{s.t}, 0, s_col0,
                                      dt_tt);
  wgmma_commit();
  wgmma_wait<1>();
  fence_accumulators(kk, dy);

  // While dT T^T runs: dv = beta dY (bf16 [BT, HV, V]) and <dY_i, v_i> over this warpgroup's 64
  // columns (the quad, then slot wg)
  {
    float const b_lo = s.beta[r_lo];
    float const b_hi = s.beta[r_hi];
    float2 const dot = row_dot_shares<kVCols, kHeadDim>(
        dy, s.v + blocked_offset<kHeadDim>(r_lo, v_col0 + q2));
    float const dot_lo = quad_sum(dot.x);
    float const dot_hi = quad_sum(dot.y);
    if (lane % 4 == 0) {
      s.y_dot[wg][r_lo] = dot_lo;
      s.y_dot[wg][r_hi] = dot_hi;
    }
    if (p.dv != nullptr) {
      __nv_bfloat16* const dv = p.dv + row0 * kHeadDim + v_col0 + q2;
#pragma unroll
      for (int jb = 0; jb < kVCols / 8; ++jb) {
        float const* const y = &dy[4 * jb];
        if (r_lo < len)
          *reinterpret_cast<__nv_bfloat162*>(dv + r_lo * v_stride + 8 * jb) =
              __floats2bfloat162_rn(b_lo * y[0], b_lo * y[1]);
        if (r_hi < len)
          *reinterpret_cast<__nv_bfloat162*>(dv + r_hi * v_stride + 8 * jb) =
              __floats2bfloat162_rn(b_hi * y[2], b_hi * y[3]);
      }
    }
  }
  __syncwarp();  // wgmma.wait_group is .aligned: the warp reconverged after the rows' branches
  wgmma_wait<0>();
  fence_accumulators(dt_tt);

  // dT T^T -> dt_tt (bf16)
  {
    int const at = blocked_offset<kChunk>(r_lo, s_col0 + q2);
#pragma unroll
    for (int jb = 0; jb < kSCols / 8; ++jb) {
      float const* const x = &dt_tt[4 * jb];
      __nv_bfloat16* const d = s.dt_tt + at + kNext8Cols * jb;
      *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(x[0], x[1]);
      *reinterpret_cast<__nv_bfloat162*>(d + kNext8Rows<kChunk>) =
          __floats2bfloat162_rn(x[2], x[3]);
    }
  }
  fence_proxy_async_shared();  // dt_tt is read by wgmma
  __syncthreads();             // B2: dT T^T complete

  // {T^T (dT T^T)} (this warpgroup's columns of -dL) and {T^T dW} (its columns of dX)
  float ndl[kSCols / 2] = {};
  float dx[kVCols / 2] = {};
  fence_accumulators(ndl, dx);
  wgmma_fence();
  warpgroup_mma_async<kSCols, kChunk>(MNMajorTile<kChunk>{s.t}, MNMajorTile<kChunk>{s.dt_tt}, 0,
                                      s_col0, ndl);
  wgmma_commit();
  warpgroup_mma_async<kVCols, kChunk>(MNMajorTile<kChunk>{s.t}, MNMajorTile<kHeadDim>{s.dw}, 0,
                                      v_col0, dx);
  wgmma_commit();
  wgmma_wait<1>();
  fence_accumulators(ndl);

  // While dX runs: M_ij = -(T^T dT T^T)_ij e^{G_i - G_j} below the diagonal of the chunk's rows;
  // R = M K K^T (element-wise: kk holds the same elements) summed per row (this warpgroup's 32
  // columns: the quad, then slot wg) and, times beta_i, per column (this warp's 16 rows: the
  // thread's two rows, then the 8 lane groups, then slot warp % 4); Sym -> sym: below the
  // diagonal by the owner of (i, j), above it by the owner of (j, i), the diagonal (0) by its own
  // owner, so that each element is written by exactly one thread.
  {
    float const g_lo = s.gcum[r_lo];
    float const g_hi = s.gcum[r_hi];
    float const b_lo = s.beta[r_lo];
    float const b_hi = s.beta[r_hi];
    bool const in_lo = r_lo < len;
    bool const in_hi = r_hi < len;
    // Element offsets at jb = 0 of (i, j) and of (j, i) (block jb: 64 jb, 8 rows of blocks jb)
    int const sym_at = blocked_offset<kChunk>(r_lo, s_col0 + q2);
    int const symt_at = blocked_offset<kChunk>(s_col0 + q2, r_lo);
    float row_lo = 0.f;
    float row_hi = 0.f;
#pragma unroll
    for (int jb = 0; jb < kSCols / 8; ++jb) {
      int const j = s_col0 + 8 * jb + q2;
      float const g_j0 = s.gcum[j];
      float const g_j1 = s.gcum[j + 1];
      float const* const l = &ndl[4 * jb];  // (r_lo, j), (r_lo, j + 1), (r_hi, j), (r_hi, j + 1)
      float const* const a = &kk[4 * jb];
      // The exponentials of both triangles, then a select: no branches (above the diagonal they
      // may overflow to inf, which the select drops)
      float const m00 = in_lo && r_lo > j ? -l[0] * __expf(g_lo - g_j0) : 0.f;
      float const m01 = in_lo && r_lo > j + 1 ? -l[1] * __expf(g_lo - g_j1) : 0.f;
      float const m10 = in_hi && r_hi > j ? -l[2] * __expf(g_hi - g_j0) : 0.f;
      float const m11 = in_hi && r_hi > j + 1 ? -l[3] * __expf(g_hi - g_j1) : 0.f;
      float const r00 = m00 * a[0];
      float const r01 = m01 * a[1];
      float const r10 = m10 * a[2];
      float const r11 = m11 * a[3];
      row_lo += r00 + r01;
      row_hi += r10 + r11;
      float const col0 = column_sum(b_lo * r00 + b_hi * r10);
      float const col1 = column_sum(b_lo * r01 + b_hi * r11);
      if (lane < 4) {
        s.r_col[warp % 4][j] = col0;
        s.r_col[warp % 4][j + 1] = col1;
      }
      __nv_bfloat16 const s00 = __float2bfloat16_rn(b_lo * m00);
      __nv_bfloat16 const s01 = __float2bfloat16_rn(b_lo * m01);
      __nv_bfloat16 const s10 = __float2bfloat16_rn(b_hi * m10);
      __nv_bfloat16 const s11 = __float2bfloat16_rn(b_hi * m11);
      __nv_bfloat16* const direct = s.sym + sym_at + kNext8Cols * jb;           // (r_lo, j)
      __nv_bfloat16* const mirror = s.sym + symt_at + kNext8Rows<kChunk> * jb;  // (j, r_lo)
      if (r_lo >= j) direct[0] = s00;
      if (r_lo >= j + 1) direct[1] = s01;
      if (r_hi >= j) direct[kNext8Rows<kChunk>] = s10;
      if (r_hi >= j + 1) direct[kNext8Rows<kChunk> + 1] = s11;
      if (r_lo > j) mirror[0] = s00;
      if (r_lo > j + 1) mirror[8] = s01;
      if (r_hi > j) mirror[kNext8Cols] = s10;
      if (r_hi > j + 1) mirror[kNext8Cols + 8] = s11;
    }
    row_lo = quad_sum(row_lo);
    row_hi = quad_sum(row_hi);
    if (lane % 4 == 0) {
      s.r_row[wg][r_lo] = row_lo;
      s.r_row[wg][r_hi] = row_hi;
    }
  }
  __syncwarp();  // wgmma.wait_group is .aligned: the warp reconverged after the stores' branches
  wgmma_wait<0>();
  fence_accumulators(dx);

  // e^{G_i} <dX_i, k_i> over this warpgroup's 64 columns (the quad, then slot wg); then
  // dX *= beta_i e^{G_i}, dk^WY's first term
  {
    float2 const dot = row_dot_shares<kVCols, kHeadDim>(
        dx, s.k + blocked_offset<kHeadDim>(r_lo, v_col0 + q2));
    float const e_lo = s.eg[r_lo];
    float const e_hi = s.eg[r_hi];
    float const dot_lo = e_lo * quad_sum(dot.x);
    float const dot_hi = e_hi * quad_sum(dot.y);
    if (lane % 4 == 0) {
      s.x_dot[wg][r_lo] = dot_lo;
      s.x_dot[wg][r_hi] = dot_hi;
    }
    float const scale_lo = s.beta[r_lo] * e_lo;
    float const scale_hi = s.beta[r_hi] * e_hi;
#pragma unroll
    for (int jb = 0; jb < kVCols / 8; ++jb) {
      dx[4 * jb] *= scale_lo;
      dx[4 * jb + 1] *= scale_lo;
      dx[4 * jb + 2] *= scale_hi;
      dx[4 * jb + 3] *= scale_hi;
    }
  }
  fence_proxy_async_shared();  // sym is read by wgmma
  __syncthreads();             // B3: Sym and every partial sum complete

  // {dX += Sym K}: dk^WY, this warpgroup's 64 columns
  fence_accumulators(dx);
  wgmma_fence();
  warpgroup_mma_async<kVCols, kChunk>(KMajorTile<kChunk>{s.sym}, MNMajorTile<kHeadDim>{s.k}, 0,
                                      v_col0, dx);
  wgmma_commit();

  // dbeta and dG rows while it runs (read only the sums)
  if (tid < len) {
    float const beta = s.beta[tid];
    float const x_dot = sum_parts<kChunk, 2>(&s.x_dot[0][0], tid);
    float const r_row = sum_parts<kChunk, 2>(&s.r_row[0][0], tid);
    float const r_col = sum_parts<kChunk, 4>(&s.r_col[0][0], tid);
    if (p.dbeta != nullptr) {
      float const db = sum_parts<kChunk, 2>(&s.y_dot[0][0], tid) + x_dot + r_row;
      int64_t const row = row0 + int64_t{tid} * HV;
      if (p.dbeta_is_bf16)
        static_cast<__nv_bfloat16*>(p.dbeta)[row] = __float2bfloat16(db);
      else
        static_cast<float*>(p.dbeta)[row] = db;
    }
    s.dgc[tid] = p.dg_part[row0 + int64_t{tid} * HV] + beta * x_dot + beta * r_row - r_col;
  }
  __syncwarp();  // wgmma.wait_group is .aligned: the warp reconverged after the rows' branch
  wgmma_wait<0>();
  fence_accumulators(dx);

  // dk^WY -> dk_wy_hv (fp32 [BT, HV, K])
  float* const dk_wy = p.dk_wy_hv + row0 * kHeadDim;
  for_each_wgmma_pair<kVCols>(0, v_col0, dx, [&](int i, int col, float& c0, float& c1) {
    if (i < len) *reinterpret_cast<float2*>(dk_wy + i * v_stride + col) = make_float2(c0, c1);
  });
  __syncthreads();  // B4: dG rows complete

  if (tid < len && p.dg != nullptr) {
    float acc = 0.f;
    for (int r = tid; r < len; ++r) acc += s.dgc[r];
    p.dg[row0 + int64_t{tid} * HV] = acc;
  }
#endif
}

}  // namespace cake::kernels::wy_bwd
