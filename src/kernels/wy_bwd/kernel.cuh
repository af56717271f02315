// WY-representation backward (B7 of fla_reference.md §2.5, plus the gate's reverse cumsum):
// one CTA per (chunk, value head). With X = diag(beta) (K e^G), Y = diag(beta) V, W = T X, U = T Y:
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
// Products on the tensor cores (bf16 operands, fp32 accumulation, as FLA's bf16 dL products).
// Bitwise deterministic (a product promise): no atomics. The row sums <dY, v>, e^G <dX, k> and
// the row and column sums of R go to one slot per column tile (per 8-row group for R's column
// sums) and are added in ascending slot order after a barrier (gemm.cuh, sum_parts).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/wy_bwd/params.hpp"

namespace cake::kernels::wy_bwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kLdS = kChunk + 8;    // bf16 64x64 tiles: 144-byte rows, no ldmatrix conflicts
// Warp tiles of the dY and dX products (2 x 4 mma tiles of 16 x 8) and the row-sum partials they
// leave per row: one per column tile.
inline constexpr int kDotMi = 2;
inline constexpr int kDotNi = 4;
inline constexpr int kDotParts = kRowSumParts<kHeadDim, kDotNi>;
// R's sums come from the [64 x 64] product's epilogue, 8 columns (a quad) or 8 rows (a lane's
// group) at a time: one partial per block of 8 columns (row sums) or rows (column sums).
inline constexpr int kRParts = kChunk / 8;

// About 111 KB, so that two CTAs share an SM and one's loads overlap the other's products (the
// per-slot partials of the sums, kept for determinism, added 5 KB; 2 KB are left under the
// limit). Buffers are reused once dead: dt takes M after dT T^T; dt_tt takes
// sym_ij = beta_i M_ij + beta_j M_ji after dL. v and du are dead after dY.
struct SharedStorage {
  __nv_bfloat16 k[kChunk * kLdBf16];    // [64 x 128]
  __nv_bfloat16 dw[kChunk * kLdBf16];   // [64 x 128]
  __nv_bfloat16 v[kChunk * kLdBf16];    // [64 x 128]
  __nv_bfloat16 du[kChunk * kLdBf16];   // [64 x 128]
  __nv_bfloat16 t[kChunk * kLdS];       // [64 x 64] bf16(T)
  __nv_bfloat16 dt[kChunk * kLdS];      // [64 x 64] bf16(dT); then bf16(M)
  __nv_bfloat16 dt_tt[kChunk * kLdS];   // [64 x 64] bf16(dT T^T); then bf16(sym), see below
  __nv_bfloat16 kk[kChunk * kLdS];      // [64 x 64] bf16(K K^T)
  float gcum[kChunk];
  float beta[kChunk];
  float eg[kChunk];                     // e^{G_i}
  float x_dot[kDotParts][kChunk];       // e^{G_i} <dX_i, k_i>, one partial per column tile
  float y_dot[kDotParts][kChunk];       // <dY_i, v_i>, one partial per column tile
  float r_row[kRParts][kChunk];         // sum_j R_ij, one partial per 8 columns j
  float r_col[kRParts][kChunk];         // sum_i beta_i R_ij, one partial per 8 rows i
  float dgc[kChunk];                    // dG_i
};
static_assert(sizeof(SharedStorage) <= 113 * 1024, "wy_bwd must fit two CTAs per SM");

__global__ void __launch_bounds__(kThreads) wy_bwd_kernel(__grid_constant__ Params const p) {
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
  int const lane = tid % 32;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  int64_t const row0 = c.t0 * HV + hv;  // (token t0, head hv) in [BT, HV]

  load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                              int64_t{H} * kHeadDim, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(s.v, kLdBf16, p.v + row0 * kHeadDim, v_stride,
                                              len);
  load_tile_async<kChunk, kHeadDim, kThreads>(s.dw, kLdBf16, p.dw + row0 * kHeadDim,
                                              v_stride, len);
  cp_async_commit();
  load_tile_f32_to_bf16<kChunk, kHeadDim, kThreads>(s.du, kLdBf16, p.dv_new + row0 * kHeadDim,
                                                    v_stride, len);
  load_tile_f32_to_bf16<kChunk, kChunk, kThreads>(s.t, kLdS, p.tmat + row0 * kChunk,
                                                  int64_t{HV} * kChunk, len);
  if (tid < kChunk) {
    int64_t const row = (c.t0 + (tid < len ? tid : len - 1)) * HV + hv;
    s.gcum[tid] = p.gcum[row];
    s.eg[tid] = __expf(s.gcum[tid]);
    s.beta[tid] = tid < len ? load_scalar(p.beta, row, p.beta_is_bf16) : 0.f;
  }
  cp_async_wait<0>();
  __syncthreads();

  // dT_ij = beta_j (e_j (dW K^T)_ij + (dU V^T)_ij)
  block_gemm_mid<kChunk, kChunk, kHeadDim, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.dw, kLdBf16}, ColMajor{s.k, kLdBf16},
      [&](int, int j, float& c0, float& c1) {
        c0 *= s.eg[j];
        c1 *= s.eg[j + 1];
        return 0.f;
      },
      nullptr, RowMajor{s.du, kLdBf16}, ColMajor{s.v, kLdBf16},
      [&](int i, int j, float c0, float c1) {
        *reinterpret_cast<__nv_bfloat162*>(s.dt + i * kLdS + j) =
            __floats2bfloat162_rn(s.beta[j] * c0, s.beta[j + 1] * c1);
      });
  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.k, kLdBf16}, ColMajor{s.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
        *reinterpret_cast<__nv_bfloat162*>(s.kk + i * kLdS + j) = __floats2bfloat162_rn(c0, c1);
      });

  // dY = T^T dU: dv = beta dY, <dY, v> summed per row
  block_gemm_mid<kChunk, kHeadDim, kChunk, 0, kDotMi, kDotNi, kWarps>(
      ColMajor{s.t, kLdS}, RowMajor{s.du, kLdBf16},
      [&](int i, int col, float& c0, float& c1) {
        float2 const v = __bfloat1622float2(
            *reinterpret_cast<__nv_bfloat162 const*>(s.v + i * kLdBf16 + col));
        return c0 * v.x + c1 * v.y;
      },
      &s.y_dot[0][0], ColMajor{s.t, kLdS}, RowMajor{s.du, kLdBf16},
      [&](int i, int col, float c0, float c1) {
        if (i < len && p.dv != nullptr)
          *reinterpret_cast<__nv_bfloat162*>(p.dv + (row0 + int64_t{i} * HV) * kHeadDim + col) =
              __floats2bfloat162_rn(s.beta[i] * c0, s.beta[i] * c1);
      });
  __syncthreads();  // dT, K K^T, dY complete: v and du are dead

  block_gemm<kChunk, kChunk, kChunk, 1, 2, kWarps>(
      RowMajor{s.dt, kLdS}, ColMajor{s.t, kLdS}, [&](int i, int j, float c0, float c1) {
        *reinterpret_cast<__nv_bfloat162*>(s.dt_tt + i * kLdS + j) = __floats2bfloat162_rn(c0, c1);
      });
  __syncthreads();  // dT T^T complete: dt is dead

  // dL = -T^T (dT T^T), kept strictly lower, times e^{G_i - G_j}: M (into dt); R = M (K K^T),
  // summed per row (over the 4 lanes of a quad: 8 columns) and per column (over the 8 rows of a
  // lane group), then stored to its own slot, [j / 8][i] or [i / 8][j]: each slot is written by
  // exactly one epilogue call (one owner per output pair), so no atomics.
  block_gemm<kChunk, kChunk, kChunk, 1, 2, kWarps>(
      ColMajor{s.t, kLdS}, RowMajor{s.dt_tt, kLdS}, [&](int i, int j, float c0, float c1) {
        float const gi = s.gcum[i];
        float const m0 = i > j && i < len ? -c0 * __expf(gi - s.gcum[j]) : 0.f;
        float const m1 = i > j + 1 && i < len ? -c1 * __expf(gi - s.gcum[j + 1]) : 0.f;
        *reinterpret_cast<__nv_bfloat162*>(s.dt + i * kLdS + j) = __floats2bfloat162_rn(m0, m1);
        float2 const kk =
            __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(s.kk + i * kLdS + j));
        float const r0 = m0 * kk.x;
        float const r1 = m1 * kk.y;
        float row = r0 + r1;
        row += __shfl_xor_sync(0xffffffffu, row, 1);
        row += __shfl_xor_sync(0xffffffffu, row, 2);
        float col0 = s.beta[i] * r0;
        float col1 = s.beta[i] * r1;
        for (int d = 4; d < 32; d *= 2) {
          col0 += __shfl_xor_sync(0xffffffffu, col0, d);
          col1 += __shfl_xor_sync(0xffffffffu, col1, d);
        }
        if (lane % 4 == 0) s.r_row[j / 8][i] = row;  // quad 0: j is the first of 8 columns
        if (lane / 4 == 0) {                         // group 0: i is the first of 8 rows
          s.r_col[i / 8][j] = col0;
          s.r_col[i / 8][j + 1] = col1;
        }
      });
  __syncthreads();  // M and the R partials complete: dt_tt is dead
  for (int idx = tid; idx < kChunk * kChunk; idx += kThreads) {
    int const i = idx / kChunk;
    int const j = idx % kChunk;
    s.dt_tt[i * kLdS + j] =
        __float2bfloat16(s.beta[i] * __bfloat162float(s.dt[i * kLdS + j]) +
                         s.beta[j] * __bfloat162float(s.dt[j * kLdS + i]));
  }
  __syncthreads();  // sym complete

  // dk^WY = beta e^G (T^T dW) + sym K, with e^G <T^T dW, k> (dX's share of dbeta and dG) summed
  // between the two products
  float* const dk_wy = p.dk_wy_hv + row0 * kHeadDim;
  block_gemm_mid<kChunk, kHeadDim, kChunk, kChunk, kDotMi, kDotNi, kWarps>(
      ColMajor{s.t, kLdS}, RowMajor{s.dw, kLdBf16},
      [&](int i, int col, float& c0, float& c1) {
        float2 const k = __bfloat1622float2(
            *reinterpret_cast<__nv_bfloat162 const*>(s.k + i * kLdBf16 + col));
        float const x = s.eg[i] * (c0 * k.x + c1 * k.y);
        c0 *= s.beta[i] * s.eg[i];
        c1 *= s.beta[i] * s.eg[i];
        return x;
      },
      &s.x_dot[0][0], RowMajor{s.dt_tt, kLdS}, RowMajor{s.k, kLdBf16},
      [&](int i, int col, float c0, float c1) {
        if (i < len) *reinterpret_cast<float2*>(dk_wy + i * v_stride + col) = make_float2(c0, c1);
      });
  __syncthreads();  // x_dot partials complete (y_dot, r_row, r_col were before earlier barriers)

  if (tid < len) {
    float const beta = s.beta[tid];
    float const x_dot = sum_parts<kChunk, kDotParts>(&s.x_dot[0][0], tid);
    float const r_row = sum_parts<kChunk, kRParts>(&s.r_row[0][0], tid);
    float const r_col = sum_parts<kChunk, kRParts>(&s.r_col[0][0], tid);
    if (p.dbeta != nullptr) {
      float const db = sum_parts<kChunk, kDotParts>(&s.y_dot[0][0], tid) + x_dot + r_row;
      int64_t const row = row0 + int64_t{tid} * HV;
      if (p.dbeta_is_bf16)
        static_cast<__nv_bfloat16*>(p.dbeta)[row] = __float2bfloat16(db);
      else
        static_cast<float*>(p.dbeta)[row] = db;
    }
    s.dgc[tid] = p.dg_part[row0 + int64_t{tid} * HV] + beta * x_dot + beta * r_row - r_col;
  }
  __syncthreads();  // dG rows complete
  if (tid < len && p.dg != nullptr) {
    float acc = 0.f;
    for (int r = tid; r < len; ++r) acc += s.dgc[r];
    p.dg[row0 + int64_t{tid} * HV] = acc;
  }
#endif
}

}  // namespace cake::kernels::wy_bwd
