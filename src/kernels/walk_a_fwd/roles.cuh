// The forward walk on warpgroup roles (each chunk's output and state update; step 2 of
// docs/design/gdn-hopper-fused-walks.md): one CTA per (document, value head), walking the
// document's chunks in order with the whole [128 x 128] fp32 state h (the chunk's start state) in
// registers, Delta rebuilt from kkt_solve's A = (I + diag(beta) L)^-1. With
// Gamma_ij = e^{G_i - G_j}, T = Gamma o A, so Delta = U - W h = T diag(beta) (V - e^G (K h)).
// Per chunk:
//   K h                                      [64 x 128]
//   R     = beta_i (V - e^{G_i} (K h)_i)     [64 x 128] bf16
//   Ag    = causal(A_ij e^{G_i - G_j})       [64 x 64] bf16 (i >= j)
//   Delta = Ag R                              [64 x 128]
//   h     = e^{G_last} h + (K e^{G_last - G})^T Delta
//   P     = causal(scale (Q K^T)_ij e^{G_i - G_j})
//   O     = scale e^G (Q h) + P Delta         -> o (bf16)
// Three uses (launch.cu): recompute and inverse modes' forward (o, no h per chunk), saved mode's
// forward (o, and bf16 h per chunk for the backward) and the backward's h-walk (h per chunk, no o:
// kWithO false, so no Q h, P or P Delta). h is the same bitwise in all three (the same products
// in the same order). h per chunk is bf16(h) as the state roles write it for K h, stored from
// shared memory by TMA (one store per state warpgroup and chunk): a copy by the threads holds hb,
// which the state roles wait on (measured: saved mode's forward 17.2 ms against 16.0 ms for an
// mma.sync walk; docs/perf-notes.md), where the TMA store reads it while the step goes on.
//
// Warpgroup roles, every product a wgmma from shared memory:
// - two state warpgroups, each owning 64 of h's 128 columns (h's columns are independent: K h,
//   R, Delta and the update of a column block need only that block): per chunk bf16(h) -> hb
//   (and, by TMA, to h per chunk), K h, R, Delta = Ag R, h += K^T (ebar Delta).
// - two output warpgroups, each with half of the work off the chain: the loads (Q, K, V and A by
//   TMA, G and beta by cp.async; the next chunk's while this one is walked), Ag and P of the next
//   chunk (half of the columns each, one exponential per element for both; Ag alone without o),
//   and this chunk's O = scale e^G (Q h) + P Delta (half of O's columns each). With one output
//   warpgroup that role set the pace (the state roles spent a third of their time waiting for it
//   to free hb).
// Split walks (split.hpp says when: walks at most half the SMs): a walk runs as two CTAs, each
// with a 64-column slice of h, R, Delta and O (every product left-multiplies h, and O's columns
// need only h's and Delta's same columns), on the same roles: two state warpgroups of 32 columns
// each (wgmma N = 32) and two output warpgroups with 32 of O's columns each. Each column's
// products and roundings are the whole walk's, so o, h per chunk and the final state are the same
// bitwise. Such a CTA has its SM alone, so its chunk step is the time: the chain bf16(h) -> K h ->
// R -> Delta = Ag R -> h update. Two warpgroups of 32 columns give the tensor cores the products
// of one of 64 (the two N = 32 groups share them), but halve each thread's elementwise links of
// the chain (bf16(h) and R stores, R, Delta's stores and decay), where one warpgroup of 64 would
// keep the whole walk's per-thread work and leave a warpgroup idle; and the roles and barriers
// stay as they are. The output roles load V's 64 columns and the K side whole (Q, K, A; KDA's
// kbar and P), and form Ag and P whole (per chunk, not per column): those links stay, O's halve.
// The slice's h box (64 columns) holds both state warpgroups' columns, so they meet at one
// barrier of 256 threads where they otherwise meet at one each, and one TMA store takes the box.
// The roles meet at named barriers, one per hand-over (ptx.cuh; ids below), each a producer's
// bar.arrive and a consumer's bar.sync over all 512 threads. Q, K, V, A and hb are 128-byte
// swizzled tiles (TMA's layout), Ag, P and Delta blocked 8 x 8 core matrices (wgmma.cuh).
// Measured and not kept (docs/perf-notes.md): o staged in shared memory for 16-byte stores
// (+0.7 ms at A), Ag handed over before P is formed (+3.1 ms).
//
// The decay is the template policy Decay (common/decay.hpp). Above is ScalarDecay (GDN). With
// ChannelDecay (KDA: a decay per key channel, docs/design/kda-hopper.md) kkt_solve has put the
// decay into the operands: A is the gated T, P comes ready, and qg = Q o e^G, kg = K o e^G,
// kbar = K o e^{G_last - G} replace Q and K, so per chunk
//   R     = beta_i (V - (kg h)_i)          Delta = A R
//   h     = diag(e^{G_last}) h + kbar^T Delta   (a factor per row of h, per key channel)
//   O     = scale (qg h) + P Delta
// with the same roles and hand-overs, less the gates: the output roles form no Ag or P (their
// barriers are unused), and A and P are read as TMA left them.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/decay.hpp"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tensor_map.hpp"
#include "kernels/common/walk.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/walk_a_fwd/params.hpp"

namespace cake::kernels::walk_a_fwd::roles {

using bf16 = __nv_bfloat16;

inline constexpr int kRoleThreads = 128;                 // one warpgroup
inline constexpr int kOutputThreads = 2 * kRoleThreads;  // the two output warpgroups
inline constexpr int kThreads = 2 * kRoleThreads + kOutputThreads;
// Registers per thread (setmaxnreg; 65,536 per SM over 512 threads; ptxas allocates each role's
// code within its limit): the state roles hold h's share (64) and a [64 x 64] product (32), the
// output roles half of O (32) and of P (16) and the copies' addresses. Of the splits compiled
// (168/88, 152/104, 144/112, 128/128), 152/104 spills least (16 bytes).
inline constexpr int kStateRegs = 152;
inline constexpr int kOutputRegs = 104;
static_assert(2 * kRoleThreads * kStateRegs + kOutputThreads * kOutputRegs <= 65536,
              "the roles' registers exceed the SM's");

// The kernel's parameters: the walk's, and the TMA maps of Q, K [BT, H, 128], V [BT, HV, 128] and
// A [BT, HV, 64] as 2-D tensors (all heads' columns, tokens), 128-byte swizzled boxes of 64
// columns by one chunk's tokens: a head's tile is two boxes (one for A), a swizzled tile
// (wgmma.cuh); h_map (when p.h is given) h [num_slots, HV, 128, 128] in boxes of 64 columns by
// 128 rows (tensor_map.hpp: tile_map_shape, h_map_shape; launch.cu encodes them). ChannelDecay:
// q_map and k_map map qg and kg [BT, HV, 128], kbar_map kbar, aqk_map P [BT, HV, 64].
struct RolesParams {
  Params p;
  TensorMap q_map, k_map, v_map, a_map, h_map, kbar_map, aqk_map;
};
// One chunk's operands; two of them alternate. Q, K, V and A as TMA writes them (swizzled tiles,
// wgmma.cuh: each 1024-byte aligned).
template <class Decay>
struct ChunkTiles;
template <>
struct alignas(1024) ChunkTiles<ScalarDecay> {
  bf16 q[kChunk * kHeadDim];  // [64 x 128] swizzled
  bf16 k[kChunk * kHeadDim];  // [64 x 128] swizzled
  bf16 v[kChunk * kHeadDim];  // [64 x 128] swizzled: V; then R, then bf16(e^{G_last - G} Delta)
  bf16 a[kChunk * kChunk];    // [64 x 64]  A, swizzled
  float gcum[kChunk];         // G; rows past the end repeat G of the last token
  float beta[kChunk];         // beta; 0 past the end
};
template <>
struct alignas(1024) ChunkTiles<ChannelDecay> {
  bf16 q[kChunk * kHeadDim];     // [64 x 128] swizzled: qg
  bf16 k[kChunk * kHeadDim];     // [64 x 128] swizzled: kg
  bf16 v[kChunk * kHeadDim];     // [64 x 128] swizzled: V; then R, then bf16(Delta)
  bf16 kbar[kChunk * kHeadDim];  // [64 x 128] swizzled: kbar
  bf16 a[kChunk * kChunk];       // [64 x 64]  A (the gated T), swizzled
  bf16 p[kChunk * kChunk];       // [64 x 64]  P, swizzled (with o)
  float glast[kHeadDim];         // G of the chunk's last token, per key channel
  float beta[kChunk];            // beta; 0 past the end
};
// The bytes one chunk's TMA copies bring (K, V's kCols columns of the CTA, A, and Q with o;
// ChannelDecay: also kbar and, with o, P). The h-walk (no o) reads no Q: neither Q h nor P is
// formed there.
template <class Decay, bool kWithO, int kCols>
inline constexpr uint32_t kTmaBytes =
    Decay::kGatedKkt
        ? ((kWithO ? 3 : 2) * kChunk * kHeadDim + kChunk * kCols +
           (kWithO ? 2 : 1) * kChunk * kChunk) * 2
        : ((kWithO ? 2 : 1) * kChunk * kHeadDim + kChunk * kCols + kChunk * kChunk) * 2;

template <class Decay>
struct SharedStorage;
// About 193 KB: one CTA per SM.
template <>
struct SharedStorage<ScalarDecay> {
  ChunkTiles<ScalarDecay> tiles[2];
  bf16 hb[kHeadDim * kHeadDim];   // [128 x 128] bf16(h), swizzled: operand of K h and Q h, and
                                  // the source of h's TMA stores
  bf16 delta[kChunk * kHeadDim];  // [64 x 128]  bf16(Delta), operand of P Delta
  bf16 ag[2][kChunk * kChunk];    // [64 x 64]   bf16(Ag), by chunk parity
  bf16 p[2][kChunk * kChunk];     // [64 x 64]   bf16(P), by chunk parity
  uint64_t tiles_landed[2];       // mbarriers: a chunk's TMA copies, by chunk parity
};
static_assert(sizeof(SharedStorage<ScalarDecay>) <= 227 * 1024,
              "walk_a_fwd shared memory exceeds 227 KB");
// About 214 KB: no Ag or P of the walk's own (A and P are read from the tiles).
template <>
struct SharedStorage<ChannelDecay> {
  ChunkTiles<ChannelDecay> tiles[2];
  bf16 hb[kHeadDim * kHeadDim];   // [128 x 128] bf16(h), swizzled
  bf16 delta[kChunk * kHeadDim];  // [64 x 128]  bf16(Delta), operand of P Delta
  uint64_t tiles_landed[2];
};
static_assert(sizeof(SharedStorage<ChannelDecay>) <= 227 * 1024,
              "walk_a_fwd shared memory exceeds 227 KB with a per-channel decay");

// Named barriers (0 is __syncthreads). The *0 ones come in pairs, by chunk parity.
enum Barrier : int {
  kStateGroup0 = 1,  // a state warpgroup alone (128 threads); kStateGroup0 + 1 the other one
  kOutputGroup = 3,  // the two output warpgroups alone
  kTilesFull0 = 4,   // the output role loaded a chunk's tiles
  kTilesFree0 = 6,   // the state roles are done with a chunk's tiles
  kHbFull = 8,       // the state roles wrote bf16(h)
  kHbFree = 9,       // the output role's Q h has read it
  kAgFull0 = 10,     // the output role wrote a chunk's Ag
  kAgFree0 = 12,     // the state roles' Delta has read it
  kDeltaFull = 14,   // the state roles wrote bf16(Delta)
  kDeltaFree = 15,   // the output role's P Delta has read it
};

// An output warpgroup's share of one chunk's gates (columns 32 ow .. 32 ow + 31 of output
// warpgroup ow): Ag = causal(A o Gamma) -> ag and, kWithP, P = causal(scale (Q K^T) o Gamma) -> p,
// one exponential per element for both. tid: the thread's index in the two output warpgroups.
template <bool kWithP>
__device__ __forceinline__ void chunk_gates(ChunkTiles<ScalarDecay> const& t, bf16* ag, bf16* p,
                                            float scale, int tid) {
  constexpr int kHalf = kChunk / 2;
  int const ow = tid / kRoleThreads;
  float qk[kHalf / 2] = {};
  if constexpr (kWithP)
    warpgroup_mma<kHalf, kHeadDim>(KMajorSwizzledTile<kChunk>{t.q}, KMajorSwizzledTile<kChunk>{t.k},
                                   0, kHalf * ow, qk);
  // pairs in for_each_wgmma_pair's order: pair q at row i_lo (+ 8 for odd q), columns jc, jc + 1
  uint32_t a[kHalf / 4];
  load_swizzled_frag<kChunk, kHalf>(t.a, 0, kHalf * ow, a);
  int const i_lo = 16 * (tid % kRoleThreads / 32) + tid % 32 / 4;
  int const jc0 = kHalf * ow + 2 * (tid % 4);
#pragma unroll
  for (int q = 0; q < kHalf / 4; ++q) {
    int const i = i_lo + 8 * (q % 2);
    float2 const gate = causal_gates(t.gcum, i, jc0 + 8 * (q / 2));
    float2 const aq = bits_float2(a[q]);
    a[q] = bf16x2_bits(__floats2bfloat162_rn(aq.x * gate.x, aq.y * gate.y));
    qk[2 * q] = scale * qk[2 * q] * gate.x;  // P = (scale QK) gate
    qk[2 * q + 1] = scale * qk[2 * q + 1] * gate.y;
  }
  store_blocked_frag<kChunk, kHalf>(ag, 0, kHalf * ow, a);
  if constexpr (kWithP) store_blocked_acc<kChunk, kHalf>(p, 0, kHalf * ow, qk);
  fence_proxy_async_shared();  // ag, p are wgmma operands
}

// A state warpgroup (wg 0 or 1) of document n, in a CTA of kCols of h's columns from col0: h's
// kWg = kCols / 2 columns c0 = col0 + kWg wg .. c0 + kWg - 1 as two [64 x kWg] accumulators (rows
// 0 .. 63 and 64 .. 127 of K), walked over the document's chunks; with p.h, bf16(h)'s columns per
// chunk stored from hb by TMA in boxes of 64 columns: each warpgroup's thread 0 its own box
// (kCols = 128), or the first warpgroup's the CTA's one box (kCols = 64), which holds both
// warpgroups' columns: then the warpgroups meet at one barrier (kStateGroup0, 256 threads) where
// they otherwise meet at one each.
template <class Decay, bool kWithO, int kCols>
__device__ __forceinline__ void state_role(SharedStorage<Decay>& s, RolesParams const& rp,
                                           WalkSpan const& span, int n, int hv, int col0,
                                           int wg) {
  constexpr int kWg = kCols / 2;
  constexpr bool kOneBox = kCols < kHeadDim;  // one h box, one barrier for both warpgroups
  Params const& p = rp.p;
  int const HV = p.problem.num_v_heads;
  bool const stores_h =
      p.h != nullptr && threadIdx.x % kRoleThreads == 0 && (!kOneBox || wg == 0);
  int const c0 = col0 + kWg * wg;
  int const box_c0 = c0 / kSliceCols * kSliceCols;  // the first column of the h box stored
  int const group = kOneBox ? kStateGroup0 : kStateGroup0 + wg;
  int const group_threads = kOneBox ? 2 * kRoleThreads : kRoleThreads;
  int64_t const state_offset = (int64_t{n} * HV + hv) * kHeadDim * kHeadDim;
  StateCols<kWg> h;  // h's columns c0 .. c0 + kWg - 1
  load_state_half(h, p.h0 != nullptr ? p.h0 + state_offset : nullptr, c0);
  // This thread's two accumulator rows (for_each_wgmma_pair's layout)
  int const row_lo = 16 * (threadIdx.x % kRoleThreads / 32) + threadIdx.x % 32 / 4;
  int const row_hi = row_lo + 8;

  int64_t const num_chunks = span.num_chunks();
  for (int64_t j = 0; j < num_chunks; ++j) {
    ChunkTiles<Decay>& t = s.tiles[j % 2];
    int const parity = static_cast<int>(j % 2);
    int const len = span.chunk_len(j);

    // bf16(h) -> hb (this warpgroup's columns of the swizzled tile); the output roles read it
    // (Q h), and its TMA store to h[slot0 + j] (the previous chunk's store has read it: its wait
    // comes before the group's barrier after R)
    if (kWithO && j >= 1) named_barrier_sync(kHbFree, kThreads);
    store_swizzled_acc<kHeadDim, kWg>(s.hb, 0, c0, h.lo);
    store_swizzled_acc<kHeadDim, kWg>(s.hb, kHeadDim / 2, c0, h.hi);
    fence_proxy_async_shared();
    named_barrier_sync(group, group_threads);
    if (stores_h) {
      tma_store_3d(&rp.h_map, s.hb + swizzled_offset<kHeadDim>(0, box_c0), box_c0, 0,
                   static_cast<int>((span.slot0 + j) * HV + hv));
      bulk_commit_group();
    }
    if constexpr (kWithO) named_barrier_arrive(kHbFull, kThreads);

    named_barrier_sync(kTilesFull0 + parity, kThreads);
    // K and V came by TMA: their writes are this role's to see through the mbarrier's phase
    // (complete by now: the output roles waited for it before TilesFull; chunk j + 2 reuses the
    // barrier only after this step's TilesFree)
    mbarrier_wait(&s.tiles_landed[parity], static_cast<int>(j / 2 % 2));
    // GDN's gates of this thread's rows (ChannelDecay's are in the operands)
    float g_lo = 0.f;
    float g_hi = 0.f;
    float g_last = 0.f;
    if constexpr (!Decay::kGatedKkt) {
      g_lo = t.gcum[row_lo];
      g_hi = t.gcum[row_hi];
      g_last = t.gcum[len - 1];
    }

    // K h on this warpgroup's columns; R = beta_i (V - e^{G_i} (K h)_i) -> t.v in place (each
    // thread rewrites the elements it read; rows past the end: beta is zero there, so R is)
    {
      float kh[kWg / 2] = {};
      warpgroup_mma<kWg, kHeadDim>(KMajorSwizzledTile<kChunk>{t.k},
                                   MNMajorSwizzledTile<kHeadDim>{s.hb}, 0, c0, kh);
      float const eg_lo = Decay::kGatedKkt ? 1.f : __expf(g_lo);
      float const eg_hi = Decay::kGatedKkt ? 1.f : __expf(g_hi);
      float const beta_lo = t.beta[row_lo];
      float const beta_hi = t.beta[row_hi];
      uint32_t v[kWg / 4];  // pair q: row_lo (even q) or row_hi (odd q)
      load_swizzled_frag<kChunk, kWg>(t.v, 0, c0, v);
#pragma unroll
      for (int q = 0; q < kWg / 4; ++q) {
        float const eg = q % 2 == 0 ? eg_lo : eg_hi;
        float const b = q % 2 == 0 ? beta_lo : beta_hi;
        float2 const vq = bits_float2(v[q]);
        v[q] = bf16x2_bits(
            __floats2bfloat162_rn(b * (vq.x - eg * kh[2 * q]), b * (vq.y - eg * kh[2 * q + 1])));
      }
      store_swizzled_frag<kChunk, kWg>(t.v, 0, c0, v);
    }
    fence_proxy_async_shared();
    if (stores_h) bulk_wait_group_read<0>();  // hb may be rewritten after this barrier
    named_barrier_sync(group, group_threads);

    // Delta = Ag R on this warpgroup's columns (ChannelDecay: A R, A from the tiles)
    if constexpr (!Decay::kGatedKkt) named_barrier_sync(kAgFull0 + parity, kThreads);
    float d[kWg / 2] = {};
    if constexpr (Decay::kGatedKkt)
      warpgroup_mma<kWg, kChunk>(KMajorSwizzledTile<kChunk>{t.a},
                                 MNMajorSwizzledTile<kChunk>{t.v}, 0, c0, d);
    else
      warpgroup_mma<kWg, kChunk>(KMajorTile<kChunk>{s.ag[parity]},
                                 MNMajorSwizzledTile<kChunk>{t.v}, 0, c0, d);
    if constexpr (!Decay::kGatedKkt)
      if (j + 2 < num_chunks) named_barrier_arrive(kAgFree0 + parity, kThreads);
    named_barrier_sync(group, group_threads);  // every product of R done: t.v may be rewritten

    // delta <- bf16(Delta) (for P Delta), t.v <- bf16(e^{G_last - G} Delta) (for the update;
    // ChannelDecay: bf16(Delta), the decay is in kbar)
    if (kWithO && j >= 1) named_barrier_sync(kDeltaFree, kThreads);
    {
      float const decay_lo = row_lo < len ? (Decay::kGatedKkt ? 1.f : __expf(g_last - g_lo)) : 0.f;
      float const decay_hi = row_hi < len ? (Decay::kGatedKkt ? 1.f : __expf(g_last - g_hi)) : 0.f;
      if constexpr (kWithO) store_blocked_acc<kHeadDim, kWg>(s.delta, 0, c0, d);
#pragma unroll
      for (int q = 0; q < kWg / 4; ++q) {
        float const decay = q % 2 == 0 ? decay_lo : decay_hi;
        d[2 * q] *= decay;
        d[2 * q + 1] *= decay;
      }
      store_swizzled_acc<kChunk, kWg>(t.v, 0, c0, d);
    }
    fence_proxy_async_shared();
    named_barrier_sync(group, group_threads);
    if constexpr (kWithO) named_barrier_arrive(kDeltaFull, kThreads);

    // h = e^{G_last} h + (K e^{G_last - G})^T Delta: K^T is K's tile read M-major
    // (ChannelDecay: h = diag(e^{G_last}) h + kbar^T Delta)
    if constexpr (Decay::kGatedKkt)
      decay_rows_add_kt_x(h, t.glast, MNMajorSwizzledTile<kChunk>{t.kbar},
                          MNMajorSwizzledTile<kChunk>{t.v}, c0);
    else
      decay_add_kt_x(h, __expf(g_last), MNMajorSwizzledTile<kChunk>{t.k},
                     MNMajorSwizzledTile<kChunk>{t.v}, c0);
    if (j + 2 < num_chunks) named_barrier_arrive(kTilesFree0 + parity, kThreads);
  }

  if (p.ht != nullptr) store_state_half(h, p.ht + state_offset, c0);
  if (stores_h) {  // complete before the flag that lets the reverse walk read them (the kernel)
    bulk_wait_group<0>();
    fence_proxy_async_global();
  }
}

// The two output warpgroups of a CTA of kCols of h's columns from col0: the loads (V's kCols
// columns; Q, K, A and ChannelDecay's kbar and P whole, as every slice of a walk needs them), the
// gates (per chunk, whole in every slice) and (kWithO) O = scale e^G (Q h) + P Delta per chunk
// on the CTA's columns, each warpgroup half of the copies, of P's columns and of O's.
template <class Decay, bool kWithO, int kCols>
__device__ __forceinline__ void output_role(SharedStorage<Decay>& s, RolesParams const& rp,
                                            WalkSpan const& span, int h, int hv, int col0) {
  constexpr int kWg = kCols / 2;
  Params const& p = rp.p;
  int const tid = threadIdx.x - 2 * kRoleThreads;  // 0 .. 255
  int const ow = tid / kRoleThreads;               // this warpgroup's half
  int const oc0 = col0 + kWg * ow;                 // its columns of O
  int const HV = p.problem.num_v_heads;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  float const scale = p.problem.scale;
  int64_t const num_chunks = span.num_chunks();
  if (num_chunks == 0) return;

  // Chunk jj's Q, K, V and A by TMA (one thread) and its G and beta by cp.async (128 threads), into
  // tiles[jj % 2]; then, once landed, rows past a document's end zeroed (a box reads on into the
  // next document, whose values, a NaN included, must not reach this one's products) and the
  // tiles handed over.
  // (ChannelDecay: qg and kg of value head hv for Q and K, and kbar and P too; G's last row.)
  int const qk_head = Decay::kGatedKkt ? hv : h;
  auto load_chunk = [&](int64_t jj) {
    ChunkTiles<Decay>& t = s.tiles[jj % 2];
    int64_t const t0 = span.begin + jj * kChunk;
    if (tid == 0) {
      mbarrier_arrive_expect_tx(&s.tiles_landed[jj % 2], kTmaBytes<Decay, kWithO, kCols>);
      int const row = static_cast<int>(t0);
      uint64_t* const bar = &s.tiles_landed[jj % 2];
      for (int half = 0; half < 2; ++half) {  // 64 columns each, kChunk x 64 elements apart
        if constexpr (kWithO)
          tma_load_2d(t.q + half * kChunk * 64, &rp.q_map, qk_head * kHeadDim + 64 * half, row,
                      bar);
        tma_load_2d(t.k + half * kChunk * 64, &rp.k_map, qk_head * kHeadDim + 64 * half, row, bar);
        if (64 * half >= col0 && 64 * half < col0 + kCols)  // V: the CTA's columns alone
          tma_load_2d(t.v + half * kChunk * 64, &rp.v_map, hv * kHeadDim + 64 * half, row, bar);
        if constexpr (Decay::kGatedKkt)
          tma_load_2d(t.kbar + half * kChunk * 64, &rp.kbar_map, hv * kHeadDim + 64 * half, row,
                      bar);
      }
      tma_load_2d(t.a, &rp.a_map, hv * kChunk, row, bar);
      if constexpr (Decay::kGatedKkt && kWithO)
        tma_load_2d(t.p, &rp.aqk_map, hv * kChunk, row, bar);
    }
    if constexpr (Decay::kGatedKkt)
      load_glast_beta_async(t.glast, t.beta, p.glast, p.beta, t0, span.chunk_len(jj), HV, hv,
                            span.slot0 + jj, tid);
    else
      load_gcum_beta_async(t.gcum, t.beta, p.gcum, p.beta, t0, span.chunk_len(jj), HV, hv, tid);
    cp_async_commit();
  };
  auto hand_over_chunk = [&](int64_t jj) {
    ChunkTiles<Decay>& t = s.tiles[jj % 2];
    mbarrier_wait(&s.tiles_landed[jj % 2], static_cast<int>(jj / 2 % 2));
    int const len = span.chunk_len(jj);
    // Rows len .. 63 zeroed in 16-byte vectors, 16 per row of Q, K and V, 8 of A, in one loop
    // (not zero_rows_past_end once per tile: that spills in this role, +0.1 ms at workload A)
    if (len < kChunk) {
      int4 const zero = make_int4(0, 0, 0, 0);
      for (int i = tid; i < (kChunk - len) * 16; i += kOutputThreads) {
        int const r = len + i / 16;
        *reinterpret_cast<int4*>(t.q + swizzled_offset<kChunk>(r, 8 * (i % 16))) = zero;
        *reinterpret_cast<int4*>(t.k + swizzled_offset<kChunk>(r, 8 * (i % 16))) = zero;
        *reinterpret_cast<int4*>(t.v + swizzled_offset<kChunk>(r, 8 * (i % 16))) = zero;
        if constexpr (Decay::kGatedKkt)
          *reinterpret_cast<int4*>(t.kbar + swizzled_offset<kChunk>(r, 8 * (i % 16))) = zero;
        if (i % 16 < 8) {
          *reinterpret_cast<int4*>(t.a + swizzled_offset<kChunk>(r, 8 * (i % 16))) = zero;
          if constexpr (Decay::kGatedKkt && kWithO)
            *reinterpret_cast<int4*>(t.p + swizzled_offset<kChunk>(r, 8 * (i % 16))) = zero;
        }
      }
    }
    cp_async_wait<0>();
    fence_proxy_async_shared();
    named_barrier_sync(kOutputGroup, kOutputThreads);
    named_barrier_arrive(kTilesFull0 + static_cast<int>(jj % 2), kThreads);
  };

  // Chunk jj's gates, handed over (ScalarDecay; ChannelDecay's are in its operands, and the walk
  // reads A and P from the tiles)
  auto gates_chunk = [&](int64_t jj) {
    if constexpr (!Decay::kGatedKkt) {
      int const parity = static_cast<int>(jj % 2);
      chunk_gates<kWithO>(s.tiles[parity], s.ag[parity], s.p[parity], scale, tid);
      named_barrier_sync(kOutputGroup, kOutputThreads);
      named_barrier_arrive(kAgFull0 + parity, kThreads);
    }
  };
  // The gates of chunk j + 1 at walk step j, once its Ag buffer (parity next) is free
  auto next_gates = [&](int64_t j, int next) {
    if constexpr (!Decay::kGatedKkt) {
      if (j >= 1) named_barrier_sync(kAgFree0 + next, kThreads);
      gates_chunk(j + 1);
    }
  };

  // Chunk 0's tiles and gates
  load_chunk(0);
  hand_over_chunk(0);
  gates_chunk(0);

  if constexpr (!kWithO) {  // the h-walk: the next chunk's tiles and gates as soon as they are free
    for (int64_t j = 0; j + 1 < num_chunks; ++j) {
      int const next = 1 - static_cast<int>(j % 2);
      if (j >= 1) named_barrier_sync(kTilesFree0 + next, kThreads);
      load_chunk(j + 1);
      hand_over_chunk(j + 1);
      next_gates(j, next);
    }
    return;
  }

  int const row_lo = 16 * (tid % kRoleThreads / 32) + tid % 32 / 4;
  for (int64_t j = 0; j < num_chunks; ++j) {
    ChunkTiles<Decay>& t = s.tiles[j % 2];
    int const parity = static_cast<int>(j % 2);
    int const next = 1 - parity;
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);
    bool const has_next = j + 1 < num_chunks;

    // Q h, then hb is free for the state roles' next h (they wait on it)
    float o_acc[kWg / 2] = {};  // O's columns oc0 .. oc0 + kWg - 1
    named_barrier_sync(kHbFull, kThreads);
    fence_accumulators(o_acc);
    wgmma_fence();
    warpgroup_mma_async<kWg, kHeadDim>(KMajorSwizzledTile<kChunk>{t.q},
                                       MNMajorSwizzledTile<kHeadDim>{s.hb}, 0, oc0, o_acc);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(o_acc);
    if (has_next) named_barrier_arrive(kHbFree, kThreads);

    // The next chunk's loads, in flight through P Delta and the o stores
    if (has_next) {
      if (j >= 1) named_barrier_sync(kTilesFree0 + next, kThreads);
      load_chunk(j + 1);
    }
    // O's first term scale e^{G_i} (Q h)_i (the row scale on the fp32 product, as FLA does;
    // ChannelDecay: scale (qg h)_i)
    float q_lo = scale;
    float q_hi = scale;
    if constexpr (!Decay::kGatedKkt) {
      q_lo = scale * __expf(t.gcum[row_lo]);
      q_hi = scale * __expf(t.gcum[row_lo + 8]);
    }
    for_each_wgmma_pair<kWg>(0, oc0, o_acc, [&](int r, int, float& x0, float& x1) {
      float const q_scale = r == row_lo ? q_lo : q_hi;
      x0 *= q_scale;
      x1 *= q_scale;
    });

    // O += P Delta -> o
    named_barrier_sync(kDeltaFull, kThreads);
    fence_accumulators(o_acc);
    wgmma_fence();
    if constexpr (Decay::kGatedKkt)
      warpgroup_mma_async<kWg, kChunk>(KMajorSwizzledTile<kChunk>{t.p},
                                       MNMajorTile<kHeadDim>{s.delta}, 0, oc0, o_acc);
    else
      warpgroup_mma_async<kWg, kChunk>(KMajorTile<kChunk>{s.p[parity]},
                                       MNMajorTile<kHeadDim>{s.delta}, 0, oc0, o_acc);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(o_acc);
    if (has_next) named_barrier_arrive(kDeltaFree, kThreads);
    bf16* const o = p.o + (t0 * HV + hv) * kHeadDim;
    for_each_wgmma_pair<kWg>(0, oc0, o_acc, [&](int r, int c, float& x0, float& x1) {
      if (r < len)
        *reinterpret_cast<__nv_bfloat162*>(o + r * v_stride + c) = __floats2bfloat162_rn(x0, x1);
    });
    // The next chunk's tiles, then its gates (the state roles' Delta of that chunk waits on them),
    // after this chunk's o: the copies have the time of P Delta and the o stores to land (this
    // role sets the walk's pace: the state roles waited on it, docs/perf-notes.md)
    if (has_next) {
      hand_over_chunk(j + 1);
      next_gates(j, next);
    }
  }
}

// kWithO: o (the forward, h per chunk too where p.h is given) or not (the backward's h-walk). A
// template parameter, not a branch: the roles' registers are tight. kSlices: 1, a CTA per walk,
// or kSlicesOfH, a CTA per 64-column slice of a walk (walk_slice_of_block; split.hpp says when).
template <class Decay, bool kWithO, int kSlices>
__global__ void __launch_bounds__(kThreads, 1)
    walk_a_fwd_roles_kernel(__grid_constant__ RolesParams const rp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage<Decay>*>(smem_raw);
  Params const& p = rp.p;
  // Every block of the h-walk is resident once it gets here (one per SM), so the reverse walk's
  // blocks, which wait on these blocks' flags, can take the SMs this grid leaves idle without a
  // deadlock.
  if (!kWithO && p.walk_done != nullptr) launch_dependents();
  if (threadIdx.x == 0) {
    mbarrier_init(&s.tiles_landed[0], 1);
    mbarrier_init(&s.tiles_landed[1], 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  constexpr int kCols = kHeadDim / kSlices;
  WalkSlice const slice = walk_slice_of_block<kSlices>(p.problem, blockIdx.x);
  WalkRef const walk = slice.walk;
  WalkSpan const span = walk_span(p.problem, walk);
  run_roles<kStateRegs, kOutputRegs>(
      [&](int wg) {
        state_role<Decay, kWithO, kCols>(s, rp, span, walk.n, walk.hv, slice.c0, wg);
      },
      [&] {
        output_role<Decay, kWithO, kCols>(s, rp, span, walk.hv / p.problem.group_size(), walk.hv,
                                          slice.c0);
      });
  if (!kWithO && p.walk_done != nullptr)
    signal_flag(p.walk_done + int64_t{walk.n} * p.problem.num_v_heads + walk.hv,
                kSlicesOfH / kSlices);
#endif
}

}  // namespace cake::kernels::walk_a_fwd::roles
