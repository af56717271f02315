// Intra-chunk part of dDelta (B3 of fla_reference.md §2.5): one CTA per (chunk, value head).
//   S        = Q K^T                                      [64 x 64]
//   A        = causal(scale S_ij e^{G_i - G_j})  (i >= j)  [64 x 64], as in state_output_fwd
//   dDelta_a = A^T dO                                     [64 x 128] fp32 out
// The state walk (state_bwd) adds the inter-chunk part in place.
//
// Products: wgmma (bf16 operands in blocked shared tiles, common/wgmma.cuh; fp32 accumulators in
// registers), two warpgroups, each taking half the columns of both products: 32 of S (so it
// forms those 32 columns of A), 64 of A^T dO. So both issue the same instructions on different
// columns. Why wgmma: with mma.sync each warp read its operands from shared memory per warp tile
// (ldmatrix, ~190 KB per CTA for 2 MFLOP); wgmma reads them once per warpgroup (~80 KB per CTA),
// which leaves DRAM as the bound (~60 KB per CTA at G = 3, below).
// Operand majors, from how each tile is stored (rows = tokens, as in global memory):
//   S = Q K^T:     Q K-major A, K K-major B
//   A^T dO:        A M-major A (its rows i are the reduction), dO N-major B
// Schedule (barriers B0..B2):
//   loads: {Q, K, G} then {dO}, two cp.async groups; B0 once the first landed
//   {S}; the exponentials and bf16(A) in registers; B1 (both warpgroups done reading Q);
//   A -> a (aliasing q), while dO lands; B2
//   {A^T dO}; dDelta_a out (rows < len).
// Grid: 1-D, blockIdx.x = slot HV + hv: the G value heads of a q/k head run together and read Q
// and K once from DRAM (then L2), and neighbouring CTAs write neighbouring rows of the [BT, HV, V]
// output. DRAM per (chunk, value head): dO 16 KB in, dDelta_a 32 KB out, (Q, K) 32 KB / G.
// Rounding as before the port: A rounded once to bf16 from fp32 scale S_ij e^{G_i - G_j}; G rows
// past the end repeat the last token's, so no exponent there is large (Q, K rows there are zero,
// so A is zero there).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"  // pack_bf16x2
#include "kernels/common/problem.hpp"
#include "kernels/common/wgmma.cuh"
#include "kernels/dv_local_bwd/params.hpp"

namespace cake::kernels::dv_local_bwd {

inline constexpr int kThreads = 256;         // two warpgroups
inline constexpr int kSCols = kChunk / 2;    // columns of S (and A) per warpgroup
inline constexpr int kVCols = kHeadDim / 2;  // columns of A^T dO per warpgroup

// 49,408 bytes, so that four CTAs share an SM (and 64 registers a thread): the kernel is
// chunk-parallel and DRAM-bound, and other CTAs' loads and stores cover each one's latency. A
// ([64 x 64] bf16) takes the first 8 KB of q, dead once both warpgroups waited for S (B1).
struct SharedStorage {
  __nv_bfloat16 q[kChunk * kHeadDim];     // [64 x 128], then bf16(A) [64 x 64] in its first half
  __nv_bfloat16 k[kChunk * kHeadDim];     // [64 x 128]
  __nv_bfloat16 dout[kChunk * kHeadDim];  // [64 x 128]
  float gcum[kChunk];                     // G; rows past the end repeat G of the last token
};
static_assert(sizeof(SharedStorage) <= 56 * 1024, "dv_local_bwd must fit four CTAs per SM");

__global__ void __launch_bounds__(kThreads, 4)
    dv_local_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
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
  float const scale = p.problem.scale;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  int64_t const row0 = c.t0 * HV + hv;  // (token t0, head hv) in [BT, HV]
  int const s_col0 = kSCols * wg;       // this warpgroup's columns of S and A
  int const v_col0 = kVCols * wg;       // ... and of A^T dO
  // This thread's accumulator rows r_lo and r_lo + 8 (ptx.cuh, wgmma) and first column in a block
  int const r_lo = 16 * (warp % 4) + lane / 4;
  int const r_hi = r_lo + 8;
  int const q2 = 2 * (lane % 4);
  __nv_bfloat16* const a = s.q;  // bf16(A), blocked [64 x 64], from B1 on

  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.q, p.q + (c.t0 * H + h) * kHeadDim,
                                                      qk_stride, len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.k, p.k + (c.t0 * H + h) * kHeadDim,
                                                      qk_stride, len);
  if (tid < kChunk)  // past the end: G of the last token, so that no exponent there is large
    cp_async_4(&s.gcum[tid], p.gcum + row0 + int64_t{tid < len ? tid : len - 1} * HV, true);
  cp_async_commit();
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(s.dout, p.dout + row0 * kHeadDim, v_stride,
                                                      len);
  cp_async_commit();
  cp_async_wait<1>();
  fence_proxy_async_shared();  // q, k are read by wgmma (the async proxy)
  __syncthreads();             // B0: q, k, G visible

  // {S = Q K^T}, this warpgroup's 32 columns
  float qk[kSCols / 2] = {};
  fence_accumulators(qk);
  wgmma_fence();
  warpgroup_mma_async<kSCols, kHeadDim>(KMajorTile<kHeadDim>{s.q}, KMajorTile<kHeadDim>{s.k}, 0,
                                        s_col0, qk);
  wgmma_commit();
  float const g_lo = s.gcum[r_lo];
  float const g_hi = s.gcum[r_hi];
  wgmma_wait<0>();
  fence_accumulators(qk);

  // A_ij = scale S_ij e^{G_i - G_j} for i >= j, else 0, as bf16 pairs (r_lo, j..j + 1) and
  // (r_hi, j..j + 1) of column block jb. Above the diagonal the exponential may overflow to inf:
  // the mask's select (or the branch the compiler makes of it) keeps it out of A.
  uint32_t a_lo[kSCols / 8];
  uint32_t a_hi[kSCols / 8];
#pragma unroll
  for (int jb = 0; jb < kSCols / 8; ++jb) {
    int const j = s_col0 + 8 * jb + q2;
    float const g_j0 = s.gcum[j];
    float const g_j1 = s.gcum[j + 1];
    float const* const sv = &qk[4 * jb];  // (r_lo, j), (r_lo, j + 1), (r_hi, j), (r_hi, j + 1)
    a_lo[jb] = pack_bf16x2(r_lo >= j ? scale * sv[0] * __expf(g_lo - g_j0) : 0.f,
                           r_lo >= j + 1 ? scale * sv[1] * __expf(g_lo - g_j1) : 0.f);
    a_hi[jb] = pack_bf16x2(r_hi >= j ? scale * sv[2] * __expf(g_hi - g_j0) : 0.f,
                           r_hi >= j + 1 ? scale * sv[3] * __expf(g_hi - g_j1) : 0.f);
  }
  __syncthreads();  // B1: both warpgroups waited for S, so q is dead

  // A -> a; each store of a warp fills one core matrix (128 contiguous bytes, conflict-free)
  {
    uint32_t* const at = reinterpret_cast<uint32_t*>(a + blocked_offset<kChunk>(r_lo, s_col0 + q2));
#pragma unroll
    for (int jb = 0; jb < kSCols / 8; ++jb) {
      at[(kNext8Cols * jb) / 2] = a_lo[jb];
      at[(kNext8Cols * jb + kNext8Rows<kChunk>) / 2] = a_hi[jb];
    }
  }
  cp_async_wait<0>();
  fence_proxy_async_shared();  // a and dout are read by wgmma
  __syncthreads();             // B2: A and dO visible

  // {dDelta_a = A^T dO}, this warpgroup's 64 columns
  float dd[kVCols / 2] = {};
  warpgroup_mma<kVCols, kChunk>(MNMajorTile<kChunk>{a}, MNMajorTile<kHeadDim>{s.dout}, 0, v_col0,
                                dd);

  // dDelta_a -> dv_new (fp32 [BT, HV, V]), the chunk's rows
  float* const dv_new = p.dv_new + row0 * kHeadDim;
  for_each_wgmma_pair<kVCols>(0, v_col0, dd, [&](int j, int col, float& c0, float& c1) {
    if (j < len) *reinterpret_cast<float2*>(dv_new + j * v_stride + col) = make_float2(c0, c1);
  });
#endif
}

}  // namespace cake::kernels::dv_local_bwd
