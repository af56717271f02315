// What the state walks (walk_a_fwd, walk_a_bwd) share: which (document, value head) a walk's CTA
// takes and in what order, the span of its document, the roles' split of the registers, a chunk's
// G and beta loads, the causal gates, and the state in registers (a state warpgroup's half of the
// columns).
#pragma once

#include <cstdint>

#include "kernels/common/problem.hpp"
#include "kernels/common/ptx.cuh"
#include "kernels/common/walk_slices.hpp"
#include "kernels/common/wgmma.cuh"

namespace cake::kernels {

// One CTA of a state walk: document n, value head hv.
struct WalkRef {
  int32_t n;
  int32_t hv;
};

// The walk of linear block `block` (a 1-D grid of N x HV CTAs): value heads fastest, so that the
// walks reading the same q/k head's Q and K tiles run side by side (L2 reuse), then documents
// longest first, so that the walks that set the kernel's length start in the first wave
// (longest-processing-time order). The ranking runs in each warp (one document per lane) for up
// to 32 documents; more documents keep their order (many documents are short, and their order
// matters less). Every thread of the CTA must call it.
__device__ __forceinline__ WalkRef walk_of_block(Problem const& p, int64_t block) {
  WalkRef w;
  w.hv = static_cast<int32_t>(block % p.num_v_heads);
  int32_t const rank = static_cast<int32_t>(block / p.num_v_heads);
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

// Block `block` of a forward walk whose walks run as kSlices CTAs each (1 or kSlicesOfH): walk
// walk_of_block(block / kSlices), its columns c0 .. c0 + kHeadDim / kSlices - 1. A walk's slices
// are adjacent blocks, so that they read its K-side tiles (Q, K, A, ...) at about the same time:
// one from HBM, the other from L2. Every thread of the CTA must call it.
struct WalkSlice {
  WalkRef walk;
  int c0;
};
template <int kSlices>
__device__ __forceinline__ WalkSlice walk_slice_of_block(Problem const& p, int64_t block) {
  static_assert(kSlices == 1 || kSlices == kSlicesOfH, "whole walks, or 64-column slices");
  return {walk_of_block(p, block / kSlices),
          static_cast<int>(block % kSlices) * (kHeadDim / kSlices)};
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

// x read where it is called, through volatile loads of its 4-byte words: for a role walk's
// document and heads, kept in shared memory (T: WalkRef, WalkSpan). The compiler can then keep
// neither x nor what is formed from it (the tiles' global offsets) across the role's loop: a role
// short of registers otherwise keeps those in local memory and reloads them from L2 at every
// step (with ~220 KB of shared memory, L1 holds ~30 KB; docs/perf-notes.md, the spill lesson).
template <class T>
__device__ __forceinline__ T read_here(T const& x) {
  static_assert(sizeof(T) % 4 == 0, "read_here: a whole number of 4-byte words");
  T out;
  auto const volatile* const src = reinterpret_cast<int32_t const volatile*>(&x);
  auto* const dst = reinterpret_cast<int32_t*>(&out);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 4); ++i) dst[i] = src[i];
  return out;
}

// The entry of a walk on four warpgroup roles (walk_a_fwd/roles.cuh, walk_a_bwd): warpgroups 0
// and 1 take kLeadRegs registers per thread and run lead(wg); warpgroups 2 and 3 give registers
// back (kRestRegs) and run rest(). The test is warp-uniform: the roles never diverge in a warp.
template <int kLeadRegs, int kRestRegs, class Lead, class Rest>
__device__ __forceinline__ void run_roles(Lead const& lead, Rest const& rest) {
  int const wg = threadIdx.x / 128;
  if (wg < 2) {
    setmaxnreg_inc<kLeadRegs>();
    lead(wg);
  } else {
    setmaxnreg_dec<kRestRegs>();
    rest();
  }
}

// G and beta of tokens t0 .. t0 + 63 of value head hv (gcum, beta [BT, HV], fp32) -> gcum_dst,
// beta_dst [64], by threads tid 0 .. 127 of the copying group (G by 0 .. 63, beta by 64 .. 127;
// cp.async, committed with the caller's tiles). Past the chunk's end G repeats its last token's
// (no large exponent forms from those rows) and beta is 0.
__device__ __forceinline__ void load_gcum_beta_async(float* gcum_dst, float* beta_dst,
                                                     float const* gcum, float const* beta,
                                                     int64_t t0, int len, int HV, int hv, int tid) {
  if (tid < kChunk) {
    cp_async_4(&gcum_dst[tid], gcum + (t0 + (tid < len ? tid : len - 1)) * HV + hv, true);
  } else if (tid < 2 * kChunk) {
    int const r = tid - kChunk;
    cp_async_4(&beta_dst[r], beta + (t0 + (r < len ? r : 0)) * HV + hv, r < len);
  }
}

// G of the last token of the chunk in slot `slot` for value head hv (glast [num_slots, HV, 128]
// fp32: a decay per key channel, from kkt_solve<ChannelDecay>) -> glast_dst [128] by threads
// tid 0 .. 31 (16-byte cp.async each), and beta of tokens t0 .. t0 + len - 1 as
// load_gcum_beta_async does (threads 64 .. 127); committed with the caller's tiles.
__device__ __forceinline__ void load_glast_beta_async(float* glast_dst, float* beta_dst,
                                                      float const* glast, float const* beta,
                                                      int64_t t0, int len, int HV, int hv,
                                                      int64_t slot, int tid) {
  if (tid < kHeadDim / 4) {
    cp_async_16(&glast_dst[4 * tid], glast + (slot * HV + hv) * kHeadDim + 4 * tid, true);
  } else if (tid >= kChunk && tid < 2 * kChunk) {
    int const r = tid - kChunk;
    cp_async_4(&beta_dst[r], beta + (t0 + (r < len ? r : 0)) * HV + hv, r < len);
  }
}

// Rows len .. 63 of a swizzled [64 x cols] tile (wgmma.cuh) zeroed in 16-byte vectors by threads
// tid 0 .. kThreads - 1: a TMA box of a document's last chunk reads on into the next document,
// whose values (a NaN included) must not reach this one's products.
template <int kThreads>
__device__ __forceinline__ void zero_rows_past_end(__nv_bfloat16* tile, int cols, int len,
                                                   int tid) {
  int4 const zero = make_int4(0, 0, 0, 0);
  for (int i = tid; i < (kChunk - len) * cols / 8; i += kThreads) {
    int const r = len + i / (cols / 8);
    *reinterpret_cast<int4*>(tile + swizzled_offset<kChunk>(r, 8 * (i % (cols / 8)))) = zero;
  }
}

// A state warpgroup's share of the [128 x 128] fp32 state h: kN columns c0 .. c0 + kN - 1 as two
// [64 x kN] wgmma accumulators, rows 0 .. 63 (lo) and 64 .. 127 (hi) (for_each_wgmma_pair's
// layout). kN = 64: one of two warpgroups of a walk over all 128 columns; kN = 32: one of two of a
// walk over a 64-column slice (walk_a_fwd's split walks).
inline constexpr int kStateHalf = kHeadDim / 2;
template <int kN>
struct StateCols {
  float lo[kN / 2];
  float hi[kN / 2];
};
using StateHalf = StateCols<kStateHalf>;

// f(r, c, x0, x1) for each pair of adjacent elements of the share (r, c: the state's row, column).
template <int kN, class F>
__device__ __forceinline__ void for_each_state_pair(StateCols<kN>& st, int c0, F const& f) {
  for_each_wgmma_pair<kN>(0, c0, st.lo, f);
  for_each_wgmma_pair<kN>(kHeadDim / 2, c0, st.hi, f);
}

// The share <- the fp32 [128 x 128] state at src (row-major), or zeros when src is nullptr.
template <int kN>
__device__ __forceinline__ void load_state_half(StateCols<kN>& st, float const* src, int c0) {
  for_each_state_pair(st, c0, [&](int r, int c, float& x0, float& x1) {
    float2 const x = src != nullptr ? *reinterpret_cast<float2 const*>(src + r * kHeadDim + c)
                                    : make_float2(0.f, 0.f);
    x0 = x.x;
    x1 = x.y;
  });
}

// The fp32 [128 x 128] state at dst (row-major) <- the share.
template <int kN>
__device__ __forceinline__ void store_state_half(StateCols<kN>& st, float* dst, int c0) {
  for_each_state_pair(st, c0, [&](int r, int c, float& x0, float& x1) {
    *reinterpret_cast<float2*>(dst + r * kHeadDim + c) = make_float2(x0, x1);
  });
}

// The share += K^T X[:, c0 .. c0 + kN - 1], K and X [64 x 128] tiles read through the views kt
// (K^T: K read M-major) and x (N-major): MNMajorTile<128> for blocked tiles,
// MNMajorSwizzledTile<kChunk> for 128-byte swizzled ones (wgmma.cuh); complete on return.
template <int kN, class KT, class XT>
__device__ __forceinline__ void add_kt_x(StateCols<kN>& st, KT const& kt, XT const& x, int c0) {
  fence_accumulators(st.lo);
  fence_accumulators(st.hi);
  wgmma_fence();
  warpgroup_mma_async<kN, kChunk>(kt, x, 0, c0, st.lo);
  warpgroup_mma_async<kN, kChunk>(kt, x, kHeadDim / 2, c0, st.hi);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(st.lo);
  fence_accumulators(st.hi);
}

// The share <- gamma x share + K^T X[:, c0 .. c0 + kN - 1] (a scalar decay, GDN).
template <int kN, class KT, class XT>
__device__ __forceinline__ void decay_add_kt_x(StateCols<kN>& st, float gamma, KT const& kt,
                                               XT const& x, int c0) {
  for (float& v : st.lo) v *= gamma;
  for (float& v : st.hi) v *= gamma;
  add_kt_x(st, kt, x, c0);
}

// The share <- diag(e^{log_gamma}) share (a decay per row of the state, per key channel: KDA);
// log_gamma [128] in shared memory, each factor one exponential. A thread holds rows r0 and r0 + 8
// of each 64-row half (for_each_wgmma_pair's layout): four factors.
template <int kN>
__device__ __forceinline__ void decay_rows(StateCols<kN>& st, float const* log_gamma, int c0) {
  constexpr int kHalfRows = kHeadDim / 2;
  int const r0 = 16 * (threadIdx.x % 128 / 32) + threadIdx.x % 32 / 4;
  float const lo0 = __expf(log_gamma[r0]);
  float const lo8 = __expf(log_gamma[r0 + 8]);
  float const hi0 = __expf(log_gamma[kHalfRows + r0]);
  float const hi8 = __expf(log_gamma[kHalfRows + r0 + 8]);
  for_each_wgmma_pair<kN>(0, c0, st.lo, [&](int r, int, float& x0, float& x1) {
    float const gamma = r == r0 ? lo0 : lo8;
    x0 *= gamma;
    x1 *= gamma;
  });
  for_each_wgmma_pair<kN>(kHalfRows, c0, st.hi, [&](int r, int, float& x0, float& x1) {
    float const gamma = r == kHalfRows + r0 ? hi0 : hi8;
    x0 *= gamma;
    x1 *= gamma;
  });
}

// The share <- diag(e^{log_gamma}) share + K^T X[:, c0 .. c0 + kN - 1] (decay_rows, then
// add_kt_x).
template <int kN, class KT, class XT>
__device__ __forceinline__ void decay_rows_add_kt_x(StateCols<kN>& st, float const* log_gamma,
                                                    KT const& kt, XT const& x, int c0) {
  decay_rows(st, log_gamma, c0);
  add_kt_x(st, kt, x, c0);
}

// The causal gates Gamma_ij = e^{G_i - G_j} of the pair (i, j), (i, j + 1) of a chunk: 0 above the
// diagonal, and formed pair by pair, so never above 1 whatever the gates (g = -20 per token only
// underflows to 0).
__device__ __forceinline__ float2 causal_gates(float const* gcum, int i, int j) {
  float const gi = gcum[i];
  return make_float2(i >= j ? __expf(gi - gcum[j]) : 0.f,
                     i >= j + 1 ? __expf(gi - gcum[j + 1]) : 0.f);
}

}  // namespace cake::kernels
