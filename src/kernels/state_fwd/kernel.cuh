// Forward state walk (stage F5 of fla_reference.md §2.2): one CTA per (document, value head,
// 64-column V slice), walking the document's chunks in order. Per chunk (h = state at the chunk's
// start, [128 x 64] fp32):
//   store bf16(h) to h[slot]                                  (read by the backward)
//   Delta = U - W h                   [64 x 64]  -> v_new (bf16)
//   h     = e^{G_last} h + (K e^{G_last - G})^T Delta         (fp32 accumulate)
// Both products run on the tensor cores with bf16 operands (h and Delta are rounded as operands,
// as in FLA); the state itself never leaves fp32 registers until the final state is written.
//
// Why this shape: the walk is sequential in chunks, so its time is the chain of per-chunk steps.
// The state lives in registers (each warp owns 16 of its 128 rows), the next chunk's K, W, U and
// G are copied (cp.async, double buffer) while the current chunk computes, and a chunk costs two
// barriers. Two V slices (not four) halve the re-reads of K and W; two CTAs share an SM.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/common/walk.cuh"
#include "kernels/state_fwd/params.hpp"

namespace cake::kernels::state_fwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kSliceV = 64;             // V columns per CTA: 2 slices x N x HV CTAs
inline constexpr int kLdSlice = kSliceV + 8;   // bf16 slice rows: 144 bytes, ldmatrix conflict-free

// One chunk's operands; two of them alternate (the next chunk loads while this one computes).
struct ChunkTiles {
  __nv_bfloat16 k[kChunk * kLdBf16];   // [64 x 128]
  __nv_bfloat16 w[kChunk * kLdBf16];   // [64 x 128]
  __nv_bfloat16 u[kChunk * kLdSlice];  // [64 x 64] U slice; then bf16(Delta e^{G_last - G})
  float gcum[kChunk];
};

// About 106 KB: two CTAs per SM.
struct SharedStorage {
  ChunkTiles tiles[2];
  __nv_bfloat16 hb[kHeadDim * kLdSlice];  // [128 x 64] bf16(h), the operand of W h
};
static_assert(kHeadDim % kSliceV == 0, "V must split into whole slices");
static_assert(kWarps * 16 == kHeadDim, "each warp owns 16 rows of the state");
// Delta's warp tiles: [16 x 32] (1 x 4 mma tiles of 16 x 8), one per warp.
inline constexpr int kDeltaNi = 4;
static_assert(kWarps * 16 * 8 * kDeltaNi == kChunk * kSliceV, "the warps tile Delta");
static_assert(sizeof(SharedStorage) <= 113 * 1024, "state_fwd must fit two CTAs per SM");

__device__ __forceinline__ void load_chunk(ChunkTiles& t, Params const& p, int64_t t0, int len,
                                           int h, int hv, int v0) {
  int const H = p.problem.num_qk_heads;
  int const HV = p.problem.num_v_heads;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  load_tile_async<kChunk, kHeadDim, kThreads>(t.k, kLdBf16, p.k + (t0 * H + h) * kHeadDim,
                                              int64_t{H} * kHeadDim, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(t.w, kLdBf16, p.w + (t0 * HV + hv) * kHeadDim,
                                              v_stride, len);
  load_tile_async<kChunk, kSliceV, kThreads>(
      t.u, kLdSlice, p.u + (t0 * HV + hv) * kHeadDim + v0, v_stride, len);
  int const tid = threadIdx.x;
  if (tid < kChunk)  // zero past the end
    cp_async_4(&t.gcum[tid], p.gcum + (t0 + (tid < len ? tid : 0)) * HV + hv, tid < len);
  cp_async_commit();
}

__global__ void __launch_bounds__(kThreads, 2) state_fwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  WalkRef const walk = walk_of_block(p.problem, blockIdx.x, kHeadDim / kSliceV);
  int const hv = walk.hv;
  int const v0 = walk.slice * kSliceV;
  int const HV = p.problem.num_v_heads;
  int const h = hv / p.problem.group_size();
  int const tid = threadIdx.x;
  int const warp = tid / 32;
  WalkSpan const span = walk_span(p.problem, walk);
  int64_t const state_offset = (int64_t{walk.n} * HV + hv) * kHeadDim * kHeadDim + v0;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  // This warp's rows of the state: rows 16 warp .. + 15, all 64 columns of the slice.
  int const row0 = warp * 16;
  StateRows<kSliceV> state;
  load_state_rows<kSliceV>(state, row0, p.h0, state_offset);

  int64_t const num_chunks = span.num_chunks();
  if (num_chunks > 0) load_chunk(s.tiles[0], p, span.begin, span.chunk_len(0), h, hv, v0);
  for (int64_t j = 0; j < num_chunks; ++j) {
    ChunkTiles& t = s.tiles[j % 2];
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);

    // h (the chunk's start state) -> bf16 operand. hb's last reader (W h of chunk j - 1) finished
    // before that chunk's second barrier.
    store_acc_bf16<1, kSliceV / 8>(row0, 0, state, s.hb, kLdSlice);
    cp_async_wait<0>();
    __syncthreads();  // chunk j's tiles and bf16(h) visible; chunk j - 1's tiles no longer read
    if (j + 1 < num_chunks)
      load_chunk(s.tiles[(j + 1) % 2], p, t0 + kChunk, span.chunk_len(j + 1), h, hv, v0);

    // bf16(h) -> h[slot] in 16-byte vectors (read by the output stage and the backward)
    __nv_bfloat16* const h_out = p.h + ((span.slot0 + j) * HV + hv) * kHeadDim * kHeadDim + v0;
    for (int idx = tid; idx < kHeadDim * kSliceV / 8; idx += kThreads) {
      int const r = idx / (kSliceV / 8);
      int const c = (idx % (kSliceV / 8)) * 8;
      *reinterpret_cast<uint4*>(h_out + r * kHeadDim + c) =
          *reinterpret_cast<uint4 const*>(s.hb + r * kLdSlice + c);
    }
    float const g_last = t.gcum[len - 1];

    // Delta = U - W h on this warp's [16 x 32] tile of the [64 x 64] slice; v_new <- Delta,
    // t.u <- bf16(e^{G_last - G} Delta) in place. The decays of the thread's two rows (d_row,
    // d_row + 8) once, not per element pair.
    int const d_m0 = 16 * (warp / (kSliceV / (8 * kDeltaNi)));
    int const d_n0 = 8 * kDeltaNi * (warp % (kSliceV / (8 * kDeltaNi)));
    int const d_row = d_m0 + tid % 32 / 4;
    float const decay_lo = d_row < len ? __expf(g_last - t.gcum[d_row]) : 0.f;
    float const decay_hi = d_row + 8 < len ? __expf(g_last - t.gcum[d_row + 8]) : 0.f;
    float wh[1][kDeltaNi][4] = {};
    warp_tile_mma<kHeadDim, 1, kDeltaNi>(RowMajor{t.w, kLdBf16}, RowMajor{s.hb, kLdSlice}, d_m0,
                                         d_n0, wh);
    __nv_bfloat16* const v_new = p.v_new + (t0 * HV + hv) * kHeadDim + v0;
    for_each_acc_pair<1, kDeltaNi>(d_m0, d_n0, wh, [&](int i, int col, float& c0, float& c1) {
      auto* const u2 = reinterpret_cast<__nv_bfloat162*>(t.u + i * kLdSlice + col);
      float2 const u = __bfloat1622float2(*u2);
      float const d0 = u.x - c0;
      float const d1 = u.y - c1;
      float const decay = i % 16 < 8 ? decay_lo : decay_hi;  // d_m0 is a multiple of 16
      if (i < len)
        *reinterpret_cast<__nv_bfloat162*>(v_new + i * v_stride + col) =
            __floats2bfloat162_rn(d0, d1);
      *u2 = __floats2bfloat162_rn(decay * d0, decay * d1);
    });
    __syncthreads();  // decayed Delta complete

    // h = e^{G_last} h + (K e^{G_last - G})^T Delta, in registers
    float const gamma = __expf(g_last);
    for_each_acc_pair<1, kSliceV / 8>(row0, 0, state, [&](int, int, float& c0, float& c1) {
      c0 *= gamma;
      c1 *= gamma;
    });
    warp_tile_mma<kChunk, 1, kSliceV / 8>(ColMajor{t.k, kLdBf16}, RowMajor{t.u, kLdSlice}, row0, 0,
                                          state);
  }

  if (p.ht != nullptr) store_state_rows<kSliceV>(state, row0, p.ht, state_offset);
#endif
}

}  // namespace cake::kernels::state_fwd
