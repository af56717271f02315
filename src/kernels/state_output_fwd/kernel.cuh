// Fused forward walk (stages F5 and F6 of fla_reference.md §2.2): one CTA per (document, value
// head), walking the document's chunks in order with the whole [128 x 128] fp32 state h (the
// chunk's start state) in registers. Per chunk:
//   Delta = U - W h                                            [64 x 128]
//   A     = causal(scale (Q K^T)_ij e^{G_i - G_j})  (i >= j)   [64 x 64]
//   O     = scale e^G (Q h) + A Delta                          [64 x 128] -> o (bf16)
//   h     = e^{G_last} h + (K e^{G_last - G})^T Delta          (fp32 accumulate)
// and, when the backward's set is saved, bf16(h) to h[slot] and bf16(Delta) to v_new.
// Every product runs on the tensor cores with bf16 operands and fp32 accumulation, in the same
// order per element as state_fwd (the backward's recompute) and the chunk-parallel output stage
// it replaces, so the saved set and o are bitwise those of the unfused stages.
//
// Why fused: the unfused forward wrote h per chunk (128 x 128 bf16, 32 KB per chunk and head) and
// Delta only for an output kernel to read them back; here O uses h while it is on chip, and a
// forward that saves nothing writes only o (and the final state). Why all 128 V columns per CTA
// (not two slices as state_fwd): Q, K and W tiles are read once per chunk instead of twice, and
// the CTA needs 197 KB of shared memory (double-buffered Q, K, W, U), so one CTA per SM; 16 warps
// (each owns a [16 x 64] block of the state: 32 registers per thread) keep the tensor cores fed.
// A chunk costs two barriers: O's first term Q h is taken right after h is shared (bf16), in one
// loop with W h (h's fragments read once for both: the walk is bound by shared-memory operand
// traffic), so that h's shared copy is free again when the next chunk writes it.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/common/walk.cuh"
#include "kernels/state_output_fwd/params.hpp"

namespace cake::kernels::state_output_fwd {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kStateCols = 64;    // state columns per warp: 8 row blocks x 2 column halves
inline constexpr int kLdA = kChunk + 8;  // bf16 A: 144-byte rows, ldmatrix conflict-free
// O's warp tiles: [16 x 32] (1 x 4 mma tiles of 16 x 8), 16 of them, one per warp.
inline constexpr int kOutNi = 4;

// One chunk's operands; two of them alternate (the next chunk loads while this one computes).
struct ChunkTiles {
  __nv_bfloat16 q[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 w[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 u[kChunk * kLdBf16];  // [64 x 128] U; then bf16(e^{G_last - G} Delta)
  float gcum[kChunk];                 // G; rows past the end repeat G of the last token
};

// About 197 KB: one CTA per SM.
struct SharedStorage {
  ChunkTiles tiles[2];
  __nv_bfloat16 hb[kHeadDim * kLdBf16];     // [128 x 128] bf16(h), operand of W h and Q h
  __nv_bfloat16 delta[kChunk * kLdBf16];    // [64 x 128] bf16(Delta), operand of A Delta
  __nv_bfloat16 a[kChunk * kLdA];           // [64 x 64] bf16(A)
};
static_assert(kWarps * 16 * kStateCols == kHeadDim * kHeadDim, "the warps tile the state");
static_assert(kWarps * 16 * 8 * kOutNi == kChunk * kHeadDim, "the warps tile O");
static_assert(sizeof(SharedStorage) <= 227 * 1024, "state_output_fwd shared memory exceeds 227 KB");

__device__ __forceinline__ void load_chunk(ChunkTiles& t, Params const& p, int64_t t0, int len,
                                           int h, int hv) {
  int const H = p.problem.num_qk_heads;
  int const HV = p.problem.num_v_heads;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  load_tile_async<kChunk, kHeadDim, kThreads>(t.q, kLdBf16, p.q + (t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(t.k, kLdBf16, p.k + (t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(t.w, kLdBf16, p.w + (t0 * HV + hv) * kHeadDim,
                                              v_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(t.u, kLdBf16, p.u + (t0 * HV + hv) * kHeadDim,
                                              v_stride, len);
  load_gcum_async(t.gcum, p.gcum, t0, len, HV, hv);
  cp_async_commit();
}

__global__ void __launch_bounds__(kThreads, 1)
    state_output_fwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  WalkRef const walk = walk_of_block(p.problem, blockIdx.x, 1);
  int const hv = walk.hv;
  int const HV = p.problem.num_v_heads;
  int const h = hv / p.problem.group_size();
  int const tid = threadIdx.x;
  int const warp = tid / 32;
  float const scale = p.problem.scale;
  WalkSpan const span = walk_span(p.problem, walk);
  int64_t const state_offset = (int64_t{walk.n} * HV + hv) * kHeadDim * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  // This warp's block of the state: rows row0 .. row0 + 15, columns col0 .. col0 + 63.
  int const row0 = 16 * (warp % (kHeadDim / 16));
  int const col0 = kStateCols * (warp / (kHeadDim / 16));
  StateRows<kStateCols> state;
  load_state_rows<kStateCols>(state, row0, p.h0, state_offset + col0);
  // This warp's tile of O: rows o_m0 .. o_m0 + 15, columns o_n0 .. o_n0 + 31.
  int const o_m0 = 16 * (warp / (kHeadDim / (8 * kOutNi)));
  int const o_n0 = 8 * kOutNi * (warp % (kHeadDim / (8 * kOutNi)));
  int const o_row = o_m0 + (tid % 32) / 4;  // this thread's rows of the tile: o_row, o_row + 8

  int64_t const num_chunks = span.num_chunks();
  if (num_chunks > 0) load_chunk(s.tiles[0], p, span.begin, span.chunk_len(0), h, hv);
  for (int64_t j = 0; j < num_chunks; ++j) {
    ChunkTiles& t = s.tiles[j % 2];
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);

    // h (the chunk's start state) -> bf16 operand. hb's last readers (W h, Q h of chunk j - 1)
    // finished before that chunk's second barrier.
    store_acc_bf16<1, kStateCols / 8>(row0, col0, state, s.hb, kLdBf16);
    cp_async_wait<0>();
    __syncthreads();  // chunk j's tiles and bf16(h) visible; chunk j - 1's tiles, delta, a free
    if (j + 1 < num_chunks)
      load_chunk(s.tiles[(j + 1) % 2], p, t0 + kChunk, span.chunk_len(j + 1), h, hv);

    if (p.h != nullptr) {  // bf16(h) -> h[slot] in 16-byte vectors (the backward's saved set)
      __nv_bfloat16* const h_out = p.h + ((span.slot0 + j) * HV + hv) * kHeadDim * kHeadDim;
      for (int idx = tid; idx < kHeadDim * kHeadDim / 8; idx += kThreads) {
        int const r = idx / (kHeadDim / 8);
        int const c = (idx % (kHeadDim / 8)) * 8;
        *reinterpret_cast<uint4*>(h_out + r * kHeadDim + c) =
            *reinterpret_cast<uint4 const*>(s.hb + r * kLdBf16 + c);
      }
    }
    float const g_last = t.gcum[len - 1];

    // Q h and W h on this warp's tile, with h's fragments read once for both
    float o_acc[1][kOutNi][4] = {};
    float wh[1][kOutNi][4] = {};
    warp_tile_mma_shared_b<kHeadDim, 1, kOutNi>(RowMajor{t.q, kLdBf16}, RowMajor{t.w, kLdBf16},
                                                RowMajor{s.hb, kLdBf16}, o_m0, o_n0, o_acc, wh);
    // This thread's two rows of O, Delta (o_row and o_row + 8): their exponentials once, not per
    // element pair (the pair loops store to shared memory, so the compiler cannot reuse G loads)
    float const g_lo = t.gcum[o_row];
    float const g_hi = t.gcum[o_row + 8];
    float const q_scale_lo = scale * __expf(g_lo);
    float const q_scale_hi = scale * __expf(g_hi);
    // O's first term scale e^{G_i} (Q h)_i: the row scale goes onto the fp32 product (as FLA
    // does), not onto q before another bf16 rounding
    for_each_acc_pair<1, kOutNi>(o_m0, o_n0, o_acc, [&](int i, int, float& c0, float& c1) {
      float const q_scale = i % 16 < 8 ? q_scale_lo : q_scale_hi;  // o_m0 is a multiple of 16
      c0 *= q_scale;
      c1 *= q_scale;
    });
    // Delta = U - W h: delta <- bf16(Delta), t.u <- bf16(e^{G_last - G} Delta) in place
    float const decay_lo = o_row < len ? __expf(g_last - g_lo) : 0.f;
    float const decay_hi = o_row + 8 < len ? __expf(g_last - g_hi) : 0.f;
    __nv_bfloat16* const v_new =
        p.v_new != nullptr ? p.v_new + (t0 * HV + hv) * kHeadDim : nullptr;
    for_each_acc_pair<1, kOutNi>(o_m0, o_n0, wh, [&](int i, int col, float& c0, float& c1) {
      auto* const u2 = reinterpret_cast<__nv_bfloat162*>(t.u + i * kLdBf16 + col);
      float2 const u = __bfloat1622float2(*u2);
      float const d0 = u.x - c0;
      float const d1 = u.y - c1;
      float const decay = i % 16 < 8 ? decay_lo : decay_hi;
      __nv_bfloat162 const d = __floats2bfloat162_rn(d0, d1);
      *reinterpret_cast<__nv_bfloat162*>(s.delta + i * kLdBf16 + col) = d;
      if (v_new != nullptr && i < len)
        *reinterpret_cast<__nv_bfloat162*>(v_new + i * v_stride + col) = d;
      *u2 = __floats2bfloat162_rn(decay * d0, decay * d1);
    });
    // A = causal(scale (Q K^T) e^{G_i - G_j})
    block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
        RowMajor{t.q, kLdBf16}, ColMajor{t.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
          float const gi = t.gcum[i];
          *reinterpret_cast<__nv_bfloat162*>(s.a + i * kLdA + j) = __floats2bfloat162_rn(
              i >= j ? scale * c0 * __expf(gi - t.gcum[j]) : 0.f,
              i >= j + 1 ? scale * c1 * __expf(gi - t.gcum[j + 1]) : 0.f);
        });
    __syncthreads();  // Delta, decayed Delta and A complete

    // O += A Delta -> o
    warp_tile_mma<kChunk, 1, kOutNi>(RowMajor{s.a, kLdA}, RowMajor{s.delta, kLdBf16}, o_m0, o_n0,
                                     o_acc);
    __nv_bfloat16* const o = p.o + (t0 * HV + hv) * kHeadDim;
    for_each_acc_pair<1, kOutNi>(o_m0, o_n0, o_acc, [&](int i, int col, float& c0, float& c1) {
      if (i < len)
        *reinterpret_cast<__nv_bfloat162*>(o + i * v_stride + col) = __floats2bfloat162_rn(c0, c1);
    });

    // h = e^{G_last} h + (K e^{G_last - G})^T Delta, in registers
    float const gamma = __expf(g_last);
    for_each_acc_pair<1, kStateCols / 8>(row0, col0, state, [&](int, int, float& c0, float& c1) {
      c0 *= gamma;
      c1 *= gamma;
    });
    warp_tile_mma<kChunk, 1, kStateCols / 8>(ColMajor{t.k, kLdBf16}, RowMajor{t.u, kLdBf16}, row0,
                                             col0, state);
  }

  if (p.ht != nullptr) store_state_rows<kStateCols>(state, row0, p.ht, state_offset + col0);
#endif
}

}  // namespace cake::kernels::state_output_fwd
