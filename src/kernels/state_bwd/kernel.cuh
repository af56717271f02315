// Backward state walk (B5 of fla_reference.md §2.5): one CTA per (document, value head), walking
// the chunks from the last to the first with dS' (the gradient of the chunk's END state,
// [128 x 128] fp32, in registers) starting from dht. Per chunk:
//   store bf16(dS') to dh[slot]
//   dDelta = A^T dO + (K e^{G_last - G}) dS'                           [64 x 128] fp32
//   dS'    = e^{G_last} dS' + scale (Q e^G)^T dO - W^T dDelta   (gradient of the start state)
// A^T dO (the intra-chunk part) comes from dv_local_bwd in dv_new, which this walk completes in
// place. The last line is two products, Q^T [scale e^G dO] and W^T [-dDelta], accumulated in that
// order. After the first chunk dS' is dh0.
//
// Products: wgmma (bf16 operands from shared memory, fp32 accumulators in registers), two
// warpgroups; warpgroup g holds rows 64 g .. 64 g + 63 of dS' (64 registers per thread) and
// computes columns 64 g .. 64 g + 63 of dDelta. As in the forward walk (state_output_fwd), wgmma
// replaces mma.sync because the walk was bound by operand reads from shared memory, and the whole
// V width per CTA reads Q, K, W and dO once per chunk. Tiles are blocked 8 x 8 core matrices
// (common/wgmma.cuh); the previous chunk's tiles load (cp.async, double buffer) while this one
// computes, and this thread's A^T dO values load into registers while K dS' runs; two barriers
// per chunk.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"
#include "kernels/common/tile.cuh"
#include "kernels/common/walk.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/state_bwd/params.hpp"

namespace cake::kernels::state_bwd {

inline constexpr int kThreads = 256;        // two warpgroups
inline constexpr int kCols = kHeadDim / 2;  // columns of dDelta per warpgroup

// One chunk's operands (blocked tiles); two of them alternate.
struct ChunkTiles {
  __nv_bfloat16 q[kChunk * kHeadDim];     // [64 x 128]
  __nv_bfloat16 w[kChunk * kHeadDim];     // [64 x 128]
  __nv_bfloat16 k[kChunk * kHeadDim];     // [64 x 128]
  __nv_bfloat16 dout[kChunk * kHeadDim];  // [64 x 128]
  float gcum[kChunk];                     // G; rows past the end repeat G of the last token
};

// About 193 KB: one CTA per SM.
struct SharedStorage {
  ChunkTiles tiles[2];
  __nv_bfloat16 dsb[kHeadDim * kHeadDim];      // [128 x 128] bf16(dS'), B of K dS'
  __nv_bfloat16 do_scaled[kChunk * kHeadDim];  // [64 x 128] bf16(scale e^G dO), B of Q^T (.)
  __nv_bfloat16 neg_dd[kChunk * kHeadDim];     // [64 x 128] bf16(-dDelta), B of W^T (.)
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "state_bwd shared memory exceeds 227 KB");

__device__ __forceinline__ void load_chunk(ChunkTiles& t, Params const& p, int64_t t0, int len,
                                           int h, int hv) {
  int const H = p.problem.num_qk_heads;
  int const HV = p.problem.num_v_heads;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(t.q, p.q + (t0 * H + h) * kHeadDim, qk_stride,
                                                      len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(t.w, p.w + (t0 * HV + hv) * kHeadDim,
                                                      v_stride, len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(t.k, p.k + (t0 * H + h) * kHeadDim, qk_stride,
                                                      len);
  load_tile_blocked_async<kChunk, kHeadDim, kThreads>(t.dout, p.dout + (t0 * HV + hv) * kHeadDim,
                                                      v_stride, len);
  load_gcum_async(t.gcum, p.gcum, t0, len, HV, hv);
  cp_async_commit();
}

__global__ void __launch_bounds__(kThreads, 1) state_bwd_kernel(__grid_constant__ Params const p) {
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

  // This warpgroup's rows of dS': 64 group .. + 63, all 128 columns.
  int const row0 = 64 * group;
  StateRows ds;
  load_state_rows(ds, row0, p.dht, state_offset);
  int const col0 = kCols * group;  // this warpgroup's columns of dDelta

  int64_t const num_chunks = span.num_chunks();
  if (num_chunks > 0)
    load_chunk(s.tiles[(num_chunks - 1) % 2], p, span.begin + (num_chunks - 1) * kChunk,
               span.chunk_len(num_chunks - 1), h, hv);
  for (int64_t j = num_chunks - 1; j >= 0; --j) {
    ChunkTiles& t = s.tiles[j % 2];
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);

    // dS' (gradient of this chunk's end state) -> bf16 operand. dsb's last readers (K dS' and the
    // dh copy of chunk j + 1) finished before that chunk's second barrier.
    share_state_rows(ds, row0, s.dsb);
    cp_async_wait<0>();
    fence_proxy_async_shared();  // the tiles and dsb are read by wgmma (the async proxy)
    __syncthreads();             // chunk j's tiles and bf16(dS') visible; chunk j + 1's tiles free
    if (j > 0) load_chunk(s.tiles[(j - 1) % 2], p, t0 - kChunk, span.chunk_len(j - 1), h, hv);

    // K dS' on this warpgroup's columns, while the rest of the chunk's preparation runs
    float kds[kCols / 2] = {};
    fence_accumulators(kds);
    wgmma_fence();
    warpgroup_mma_async<kCols, kHeadDim>(KMajorTile<kHeadDim>{t.k}, MNMajorTile<kHeadDim>{s.dsb}, 0,
                                         col0, kds);
    wgmma_commit();

    // bf16(dS') -> dh[slot]
    copy_shared_state<kThreads>(s.dsb, p.dh + ((span.slot0 + j) * HV + hv) * kHeadDim * kHeadDim);
    // do_scaled <- bf16(scale e^{G_i} dO) (rows past the end are zero)
    // (in blocked order, so that a warp's 128 bytes are contiguous: row r of element `at` is
    // 8 x its core matrix's row block + its row within the core matrix)
    for (int idx = tid; idx < kChunk * kHeadDim / 2; idx += kThreads) {
      int const at = 2 * idx;
      int const r = at / kNext8Rows<kHeadDim> * 8 + at % 64 / 8;
      float const qs = scale * __expf(t.gcum[r]);
      float2 const f = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(t.dout + at));
      *reinterpret_cast<__nv_bfloat162*>(s.do_scaled + at) =
          __floats2bfloat162_rn(qs * f.x, qs * f.y);
    }
    // This thread's A^T dO values (dv_local_bwd), in kds's layout
    float* const dd = p.dv_new + (t0 * HV + hv) * kHeadDim;
    float intra[kCols / 2];
    for_each_wgmma_pair<kCols>(0, col0, intra, [&](int i, int col, float& c0, float& c1) {
      float2 const x = i < len ? *reinterpret_cast<float2 const*>(dd + i * v_stride + col)
                               : make_float2(0.f, 0.f);
      c0 = x.x;
      c1 = x.y;
    });
    float const g_last = t.gcum[len - 1];
    wgmma_wait<0>();
    fence_accumulators(kds);

    // dDelta = A^T dO + e^{G_last - G_i} (K dS') -> dv_new; neg_dd <- bf16(-dDelta)
    int k_at = 0;
    for_each_wgmma_pair<kCols>(0, col0, kds, [&](int i, int col, float& c0, float& c1) {
      float2 val = make_float2(0.f, 0.f);
      if (i < len) {
        float const decay = __expf(g_last - t.gcum[i]);
        val = make_float2(intra[k_at] + decay * c0, intra[k_at + 1] + decay * c1);
        *reinterpret_cast<float2*>(dd + i * v_stride + col) = val;
      }
      k_at += 2;
      *reinterpret_cast<__nv_bfloat162*>(s.neg_dd + blocked_offset<kHeadDim>(i, col)) =
          __floats2bfloat162_rn(-val.x, -val.y);
    });
    fence_proxy_async_shared();
    __syncthreads();  // do_scaled and neg_dd complete

    // dS' = e^{G_last} dS' + Q^T [scale e^G dO] + W^T [-dDelta], in registers
    float const gamma = __expf(g_last);
    for_each_wgmma_pair<kHeadDim>(row0, 0, ds, [&](int, int, float& c0, float& c1) {
      c0 *= gamma;
      c1 *= gamma;
    });
    fence_accumulators(ds);
    wgmma_fence();
    warpgroup_mma_async<kHeadDim, kChunk>(MNMajorTile<kHeadDim>{t.q},
                                          MNMajorTile<kHeadDim>{s.do_scaled}, row0, 0, ds);
    warpgroup_mma_async<kHeadDim, kChunk>(MNMajorTile<kHeadDim>{t.w},
                                          MNMajorTile<kHeadDim>{s.neg_dd}, row0, 0, ds);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(ds);
  }

  if (p.dh0 != nullptr) store_state_rows(ds, row0, p.dh0, state_offset);
#endif
}

}  // namespace cake::kernels::state_bwd
