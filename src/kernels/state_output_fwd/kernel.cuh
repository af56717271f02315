// Forward walk (stages F5 and F6 of fla_reference.md §2.2): one CTA per (document, value head),
// walking the document's chunks in order with the whole [128 x 128] fp32 state h (the chunk's
// start state) in registers. Per chunk:
//   Delta = U - W h                                            [64 x 128]
//   A     = causal(scale (Q K^T)_ij e^{G_i - G_j})  (i >= j)   [64 x 64]     (with o)
//   O     = scale e^G (Q h) + A Delta                          [64 x 128] -> o (bf16, with o)
//   h     = e^{G_last} h + (K e^{G_last - G})^T Delta          (fp32 accumulate)
// and, when asked, bf16(h) to h[slot] and bf16(Delta) to v_new: the backward's saved set.
// The forward runs it with o (and, in saved mode, h and Delta); the backward's recompute without o
// and with h and Delta. Both take the same operations for h and Delta, so the saved set and its
// recompute agree bitwise.
//
// Products: wgmma (bf16 operands from shared memory, fp32 accumulators in registers), two
// warpgroups. Warpgroup g holds rows 64 g .. 64 g + 63 of h (64 registers per thread) and
// computes columns 64 g .. 64 g + 63 of Delta and O and 32 g .. 32 g + 31 of A. Why wgmma: with
// mma.sync (until v6) this walk was bound by operand reads from shared memory (~0.9 MB per chunk
// at 16 x 32 warp tiles); wgmma reads each operand once per warpgroup (~0.26 MB per chunk).
// Why fused: o uses h while it is on chip; a forward that saves nothing writes only o and the
// final state. Tiles are blocked 8 x 8 core matrices (common/wgmma.cuh); the next chunk's Q, K, W,
// U and G load (cp.async, double buffer) while this one computes; two barriers per chunk.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"
#include "kernels/common/tile.cuh"
#include "kernels/common/walk.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/state_output_fwd/params.hpp"

namespace cake::kernels::state_output_fwd {

inline constexpr int kThreads = 256;        // two warpgroups
inline constexpr int kCols = kHeadDim / 2;  // columns of Delta and O per warpgroup
inline constexpr int kACols = kChunk / 2;   // columns of A per warpgroup

// One chunk's operands (blocked tiles); two of them alternate.
struct ChunkTiles {
  __nv_bfloat16 q[kChunk * kHeadDim];  // [64 x 128] (loaded only with o)
  __nv_bfloat16 k[kChunk * kHeadDim];  // [64 x 128]
  __nv_bfloat16 w[kChunk * kHeadDim];  // [64 x 128]
  __nv_bfloat16 u[kChunk * kHeadDim];  // [64 x 128] U; then bf16(e^{G_last - G} Delta)
  float gcum[kChunk];                  // G; rows past the end repeat G of the last token
};

// About 185 KB: one CTA per SM.
struct SharedStorage {
  ChunkTiles tiles[2];
  __nv_bfloat16 hb[kHeadDim * kHeadDim];   // [128 x 128] bf16(h), B of W h and Q h
  __nv_bfloat16 delta[kChunk * kHeadDim];  // [64 x 128] bf16(Delta), B of A Delta
  __nv_bfloat16 a[kChunk * kChunk];        // [64 x 64] bf16(A), A of A Delta
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "state_output_fwd shared memory exceeds 227 KB");

template <bool kWithO>
__device__ __forceinline__ void load_chunk(ChunkTiles& t, Params const& p, int64_t t0, int len,
                                           int h, int hv) {
  int const H = p.problem.num_qk_heads;
  int const HV = p.problem.num_v_heads;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  if constexpr (kWithO)
    load_tile_blocked_async<kChunk, kHeadDim, kThreads>(t.q, p.q + (t0 * H + h) * kHeadDim,
                                                        qk_stride, len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(t.k, p.k + (t0 * H + h) * kHeadDim, qk_stride,
                                                      len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(t.w, p.w + (t0 * HV + hv) * kHeadDim,
                                                      v_stride, len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(t.u, p.u + (t0 * HV + hv) * kHeadDim,
                                                      v_stride, len);
  load_gcum_async(t.gcum, p.gcum, t0, len, HV, hv);
  cp_async_commit();
}

// kWithO: p.o != nullptr (the forward); without, the backward's recompute of h and Delta.
template <bool kWithO>
__global__ void __launch_bounds__(kThreads, 1)
    state_output_fwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  WalkRef const walk = walk_of_block(p.problem, blockIdx.x, 1);
  int const hv = walk.hv;
  int const HV = p.problem.num_v_heads;
  int const h = hv / p.problem.group_size();
  int const tid = threadIdx.x;
  int const group = tid / 128;  // warpgroup
  float const scale = p.problem.scale;
  WalkSpan const span = walk_span(p.problem, walk);
  int64_t const state_offset = (int64_t{walk.n} * HV + hv) * kHeadDim * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  // This warpgroup's rows of the state: 64 group .. + 63, all 128 columns.
  int const row0 = 64 * group;
  StateRows state;
  load_state_rows(state, row0, p.h0, state_offset);
  int const col0 = kCols * group;  // this warpgroup's columns of Delta and O
  int const a_col0 = kACols * group;

  int64_t const num_chunks = span.num_chunks();
  if (num_chunks > 0) load_chunk<kWithO>(s.tiles[0], p, span.begin, span.chunk_len(0), h, hv);
  for (int64_t j = 0; j < num_chunks; ++j) {
    ChunkTiles& t = s.tiles[j % 2];
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);

    // h (the chunk's start state) -> bf16 operand. hb's last readers (W h, Q h, the h copy of
    // chunk j - 1) finished before that chunk's second barrier.
    share_state_rows(state, row0, s.hb);
    cp_async_wait<0>();
    fence_proxy_async_shared();  // the tiles and hb are read by wgmma (the async proxy)
    __syncthreads();  // chunk j's tiles and bf16(h) visible; chunk j - 1's tiles, delta, a free
    if (j + 1 < num_chunks)
      load_chunk<kWithO>(s.tiles[(j + 1) % 2], p, t0 + kChunk, span.chunk_len(j + 1), h, hv);

    if (p.h != nullptr)  // bf16(h) -> h[slot] (the backward's saved set)
      copy_shared_state<kThreads>(s.hb, p.h + ((span.slot0 + j) * HV + hv) * kHeadDim * kHeadDim);
    float const g_last = t.gcum[len - 1];

    // W h, and with o Q h and Q K^T: one wgmma group
    float wh[kCols / 2] = {};
    float o_acc[kCols / 2] = {};
    float qk[kACols / 2] = {};
    fence_accumulators(wh);
    if constexpr (kWithO) {
      fence_accumulators(o_acc);
      fence_accumulators(qk);
    }
    wgmma_fence();
    warpgroup_mma_async<kCols, kHeadDim>(KMajorTile<kHeadDim>{t.w}, MNMajorTile<kHeadDim>{s.hb}, 0,
                                         col0, wh);
    if constexpr (kWithO) {
      warpgroup_mma_async<kCols, kHeadDim>(KMajorTile<kHeadDim>{t.q}, MNMajorTile<kHeadDim>{s.hb},
                                           0, col0, o_acc);
      warpgroup_mma_async<kACols, kHeadDim>(KMajorTile<kHeadDim>{t.q}, KMajorTile<kHeadDim>{t.k}, 0,
                                            a_col0, qk);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(wh);
    if constexpr (kWithO) {
      fence_accumulators(o_acc);
      fence_accumulators(qk);
    }

    // Delta = U - W h: delta <- bf16(Delta), t.u <- bf16(e^{G_last - G} Delta) in place (each
    // element by the thread that owns it in wh)
    __nv_bfloat16* const v_new = p.v_new != nullptr ? p.v_new + (t0 * HV + hv) * kHeadDim : nullptr;
    for_each_wgmma_pair<kCols>(0, col0, wh, [&](int i, int col, float& c0, float& c1) {
      int const at = blocked_offset<kHeadDim>(i, col);
      auto* const u2 = reinterpret_cast<__nv_bfloat162*>(t.u + at);
      float2 const u = __bfloat1622float2(*u2);
      float const d0 = u.x - c0;
      float const d1 = u.y - c1;
      float const decay = i < len ? __expf(g_last - t.gcum[i]) : 0.f;
      __nv_bfloat162 const d = __floats2bfloat162_rn(d0, d1);
      *reinterpret_cast<__nv_bfloat162*>(s.delta + at) = d;
      if (v_new != nullptr && i < len)
        *reinterpret_cast<__nv_bfloat162*>(v_new + i * v_stride + col) = d;
      *u2 = __floats2bfloat162_rn(decay * d0, decay * d1);
    });
    if constexpr (kWithO) {
      // O's first term scale e^{G_i} (Q h)_i: the row scale on the fp32 product (as FLA does)
      for_each_wgmma_pair<kCols>(0, col0, o_acc, [&](int i, int, float& c0, float& c1) {
        float const q_scale = scale * __expf(t.gcum[i]);
        c0 *= q_scale;
        c1 *= q_scale;
      });
      // A = causal(scale (Q K^T) e^{G_i - G_j})
      for_each_wgmma_pair<kACols>(0, a_col0, qk, [&](int i, int jc, float& c0, float& c1) {
        float const gi = t.gcum[i];
        *reinterpret_cast<__nv_bfloat162*>(s.a + blocked_offset<kChunk>(i, jc)) =
            __floats2bfloat162_rn(i >= jc ? scale * c0 * __expf(gi - t.gcum[jc]) : 0.f,
                                  i >= jc + 1 ? scale * c1 * __expf(gi - t.gcum[jc + 1]) : 0.f);
      });
    }
    fence_proxy_async_shared();
    __syncthreads();  // Delta, decayed Delta and A complete

    // h = e^{G_last} h + (K e^{G_last - G})^T Delta, and with o: O += A Delta. One wgmma group.
    float const gamma = __expf(g_last);
    for_each_wgmma_pair<kHeadDim>(row0, 0, state, [&](int, int, float& c0, float& c1) {
      c0 *= gamma;
      c1 *= gamma;
    });
    fence_accumulators(state);
    if constexpr (kWithO) fence_accumulators(o_acc);
    wgmma_fence();
    warpgroup_mma_async<kHeadDim, kChunk>(MNMajorTile<kHeadDim>{t.k}, MNMajorTile<kHeadDim>{t.u},
                                          row0, 0, state);
    if constexpr (kWithO)
      warpgroup_mma_async<kCols, kChunk>(KMajorTile<kChunk>{s.a}, MNMajorTile<kHeadDim>{s.delta}, 0,
                                         col0, o_acc);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(state);
    if constexpr (kWithO) fence_accumulators(o_acc);
    if constexpr (kWithO) {
      __nv_bfloat16* const o = p.o + (t0 * HV + hv) * kHeadDim;
      for_each_wgmma_pair<kCols>(0, col0, o_acc, [&](int i, int col, float& c0, float& c1) {
        if (i < len)
          *reinterpret_cast<__nv_bfloat162*>(o + i * v_stride + col) =
              __floats2bfloat162_rn(c0, c1);
      });
    }
  }

  if (p.ht != nullptr) store_state_rows(state, row0, p.ht, state_offset);
#endif
}

}  // namespace cake::kernels::state_output_fwd
