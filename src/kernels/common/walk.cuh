// What the two state walks (state_output_fwd, state_bwd) share: which (document, value head) a CTA
// walks and in what order, the span of its document, and the [128 x 128] fp32 state that its two
// warpgroups hold in wgmma accumulators (warpgroup g: rows 64 g .. 64 g + 63, 64 registers).
#pragma once

#include <cstdint>

#include "kernels/common/problem.hpp"
#include "kernels/common/wgmma.cuh"

namespace cake::kernels {

// One CTA of a state walk: document n, value head hv, V slice `slice` of num_slices.
struct WalkRef {
  int32_t n;
  int32_t hv;
  int32_t slice;
};

// The walk of linear block `block` (a 1-D grid of N x HV x num_slices CTAs): slices fastest, so
// that the CTAs reading the same K and W tiles run side by side (L2 reuse), then value heads, then
// documents longest first, so that the walks that set the kernel's length start in the first wave
// (longest-processing-time order). The ranking runs in each warp (one document per lane) for up
// to 32 documents; more documents keep their order (many documents are short, and their order
// matters less). Every thread of the CTA must call it.
__device__ __forceinline__ WalkRef walk_of_block(Problem const& p, int64_t block, int num_slices) {
  WalkRef w;
  w.slice = static_cast<int32_t>(block % num_slices);
  w.hv = static_cast<int32_t>(block / num_slices % p.num_v_heads);
  int32_t const rank = static_cast<int32_t>(block / num_slices / p.num_v_heads);
  int32_t const N = p.num_seqs;
  if (N > 32) {
    w.n = rank;
    return w;
  }
  int const lane = threadIdx.x % 32;
  long long const len = lane < N ? p.seq_begin(lane + 1) - p.seq_begin(lane) : -1;
  int32_t mine = 0;  // documents before this lane's: longer, or as long with a lower index
  for (int o = 0; o < N; ++o) {
    long long const other = __shfl_sync(0xffffffffu, len, o);
    mine += other > len || (other == len && o < lane);
  }
  unsigned const hit = __ballot_sync(0xffffffffu, lane < N && mine == rank);
  w.n = __ffs(hit) - 1;
  return w;
}

// The document of one walk: its tokens and chunks.
struct WalkSpan {
  int64_t begin;    // first token
  int64_t seq_len;  // tokens
  int64_t slot0;    // slot of chunk 0 (per-chunk buffers)

  __device__ __forceinline__ int64_t num_chunks() const { return (seq_len + kChunk - 1) / kChunk; }
  __device__ __forceinline__ int chunk_len(int64_t j) const {
    return static_cast<int>(seq_len - j * kChunk < kChunk ? seq_len - j * kChunk : kChunk);
  }
};

__device__ __forceinline__ WalkSpan walk_span(Problem const& p, WalkRef const& w) {
  WalkSpan span;
  span.begin = p.seq_begin(w.n);
  span.seq_len = p.seq_begin(w.n + 1) - span.begin;
  span.slot0 = p.slot_base(w.n);
  return span;
}

// dst[r] <- G of token t0 + r of value head hv (gcum [BT, HV]) for the chunk's 64 rows, by threads
// 0..63 (cp.async, committed with the caller's tiles); rows past the chunk's end repeat G of its
// last token, so that no exponent formed from them is large.
__device__ __forceinline__ void load_gcum_async(float* dst, float const* gcum, int64_t t0, int len,
                                                int HV, int hv) {
  int const tid = threadIdx.x;
  if (tid < kChunk)
    cp_async_4(&dst[tid], gcum + (t0 + (tid < len ? tid : len - 1)) * HV + hv, true);
}

// A walk's state rows in registers: this warpgroup's 64 rows (from row0) of a [128 x 128] state.
using StateRows = float[kHeadDim / 2];

// rows <- the fp32 state at states + offset ([K, V] row-major), or zeros when states is nullptr.
__device__ __forceinline__ void load_state_rows(StateRows& rows, int row0, float const* states,
                                                int64_t offset) {
  for_each_wgmma_pair<kHeadDim>(row0, 0, rows, [&](int r, int c, float& c0, float& c1) {
    float2 const x = states != nullptr
                         ? *reinterpret_cast<float2 const*>(states + offset + r * kHeadDim + c)
                         : make_float2(0.f, 0.f);
    c0 = x.x;
    c1 = x.y;
  });
}

// The fp32 state at states + offset <- rows.
__device__ __forceinline__ void store_state_rows(StateRows& rows, int row0, float* states,
                                                 int64_t offset) {
  for_each_wgmma_pair<kHeadDim>(row0, 0, rows, [&](int r, int c, float& c0, float& c1) {
    *reinterpret_cast<float2*>(states + offset + r * kHeadDim + c) = make_float2(c0, c1);
  });
}

// blocked [128 x 128] shared tile <- bf16(rows): the state as a wgmma operand.
__device__ __forceinline__ void share_state_rows(StateRows& rows, int row0,
                                                 __nv_bfloat16* blocked) {
  for_each_wgmma_pair<kHeadDim>(row0, 0, rows, [&](int r, int c, float& c0, float& c1) {
    *reinterpret_cast<__nv_bfloat162*>(blocked + blocked_offset<kHeadDim>(r, c)) =
        __floats2bfloat162_rn(c0, c1);
  });
}

// dst ([K, V] row-major bf16, one chunk's slot) <- the blocked [128 x 128] shared tile, in
// 16-byte vectors (one core-matrix row each) by all kThreads threads. Lanes 8 b .. 8 b + 7 read
// the 8 rows of one core matrix (contiguous, no bank conflicts), as load_tile_blocked_async.
template <int kThreads>
__device__ __forceinline__ void copy_shared_state(__nv_bfloat16 const* blocked,
                                                  __nv_bfloat16* dst) {
  constexpr int kVecs = kHeadDim / 8;
  for (int idx = threadIdx.x; idx < kHeadDim * kVecs; idx += kThreads) {
    int const r = idx / (8 * kVecs) * 8 + idx % 8;
    int const c = idx / 8 % kVecs * 8;
    *reinterpret_cast<uint4*>(dst + r * kHeadDim + c) =
        *reinterpret_cast<uint4 const*>(blocked + blocked_offset<kHeadDim>(r, c));
  }
}

}  // namespace cake::kernels
