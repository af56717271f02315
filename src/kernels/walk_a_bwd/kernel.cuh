// The fused reverse walk (step 4 of docs/design/gdn-hopper-fused-walks.md): one CTA per (document,
// value head), walking the document's chunks last to first with dS (the gradient of the chunk's end
// state, [128 x 128] fp32) in registers, and forming every gradient of a chunk on chip from its
// inputs, A (kkt_solve), G, beta and its start state h (the h-walk, walk_a_fwd with o == nullptr);
// nothing per chunk but the gradients reaches HBM. The maths, product by product, is the FP64 model
// ref/gdn_walk_model.hpp (held to the reference by tests/cpp/test_gdn_walk_model.cpp).
//
// Per chunk (e = e^G, ebar = e^{G_last - G}, gamma = e^{G_last}, Gamma_ij = e^{G_i - G_j} for
// i >= j; rows past the chunk's end are zero in every tile, so every product sees zeros there):
//   T = Gamma o A;  P = causal(s Q K^T o Gamma);  Rt = V - e (K h);  R = beta Rt;  Delta = T R
//   dDelta = ebar (K dS) + P^T dO;  Z = T^T dDelta;  dv = beta Z;  Zs = -beta e Z
//   dT = mask(dDelta R^T) -> dA = Gamma o dT;  dP = mask(dO Delta^T) -> dQK = s Gamma o dP
//   Y = A^T dA;  dL = -strict(Y A^T);  M = beta dL
//   dq = s e (dO h^T) + dQK K
//   dk = Zs h^T + dQK^T Q + M^T K + ebar (Delta dS^T) + beta (dL K)    (beta (dL K) = M K)
//   dS <- gamma dS + Q^T eO + K^T Zs,  eO = s e dO
//   E: dbeta = <Z, Rt> + <dL K, K>;  dG from the row sums (<Q, dO h^T>, <Zs h^T, K>, the gate
//      sums of T o dT and P o dP, <K dS, Delta>, <dS, h>; the terms that cancel exactly left out,
//      as in the model); dg = reverse cumsum of dG.
// dq and dk are summed over the value heads of each q/k head here, into fp32 [BT, H, K] (the
// L2-norm backward follows): the group's first value head stores its terms of a chunk, each next
// one adds its own with reductions at L2 once the one before has passed it the chunk's turn, so
// that the sum runs in ascending value-head order (bitwise reproducible) and no buffer per value
// head is needed. The walks of a group are adjacent in the ticket order and walk their chunks in
// the same order at the same pace: a walk waits for its turn about once, at its first chunk.
//
// The step on warpgroup roles, every product a wgmma from shared memory (blocked tiles,
// wgmma.cuh). Why: as a lock-step walk (16 warps of mma.sync, eight barriers per chunk, every
// phase's products and epilogues done by all warps at once) the step took ~26.7 us per chunk at
// workload A on the H200, and putting its products on wgmma inside that structure made it slower
// (docs/perf-notes.md): the step is bound by its serial structure. Here the work is split by what
// it depends on:
// - dS's recurrence is linear in the upstream gradients and involves neither h nor V, and it
//   splits by dS's columns (the V dimension): column block c needs only K dS[:, c],
//   dDelta[:, c], Z[:, c]. So two column warpgroups own 64 of dS's 128 columns each and do every
//   product in V space on their columns: K h, R, Delta, K dS, dDelta, Z, Zs, dv, the update.
// - two side warpgroups do the other products in token x token and K space: the gates T and P
//   before the chain needs them, dP -> dQK and dq while it runs, dk's terms after it, each
//   warpgroup half of the [64 x 64] products' columns and 64 of dq's and dk's 128 columns; they
//   also load the tiles and run E. The [64 x 64] chain after dDelta (dT -> dA -> Y -> dL -> M)
//   is the column roles' again, half of its columns each: it is what dk waits on, and the column
//   roles are otherwise idle once the update is issued.
// Per chunk, the hand-overs (named barriers, ids below):
//   side:   (the walk's first chunk: its loads) the chunk's tiles but A have landed ->
//           TilesFull; E of the previous chunk (one warp); Q K^T; A has landed; T, P -> GatesFull
//   column: bf16(dS) -> ds; [TilesFull] <dS, h>, eO; K h, K dS, dS = gamma dS + Q^T eO; R;
//           [GatesFull] <dS, h> -> dsh; Delta = T R, <K dS, Delta>, Delta and ebar Delta
//           -> DeltaFull;
//           dDelta = ebar (K dS) + P^T dO -> PFree; Z, <Z, K h>, <Z, V>, Zs -> ChainFull;
//           dS += K^T Zs, dv; [ColumnPair] dT, its gate sums -> DdeltaFree; dA; Y;
//           [ColumnPair] dL, K K^T, <dL K, K>, M -> MFull
//   side:   [DeltaFull] dP; [PFree] its gate sums, dQK -> p; dq; [ChainFull] the next chunk's
//           dO; dk = Zs h^T + dQK^T Q + ebar (Delta dS^T); [SideGroup] the next chunk's Q and
//           h; [DdeltaFree] its K (into dDelta's tile), V, G and beta; [MFull] dk += M^T K + M K,
//           under its A; dk stored
//   side -> column: StepDone once dk's first products have read ds (the column roles may store
//           the next bf16(dS); every other tile of the next step is ordered by TilesFull)
// Every tile of the next chunk loads during this step as soon as its last reader is done, so a
// step starts on tiles that have landed. Shared memory (~221 KB of tiles) holds one chunk (and
// K of the next, in the tile dDelta has left). Row and column sums go through one slot per
// warpgroup (or warp) and are added in ascending slot order (bitwise deterministic, no atomics).
// With the h-walk's flags (Params::h_ready) the walk runs beside the h-walk, each CTA waiting for
// its own h (walk_a_bwd_kernel).
//
// The split form, for few walks (docs/design/gdn-hopper.md, "The split reverse walk"): where the
// walks leave SMs idle the step's chain is the backward's length, so two launches of this kernel
// take its place, with the same gradients bit for bit:
// - the dS-walk (Form::kDsWalk): the walk with only dS's recurrence, which needs neither h nor
//   V. Per chunk the column roles form eO, K dS and Q^T eO, dDelta, Z, Zs and K^T Zs, the side
//   roles load Q, K, dO, A, G, beta and form T and P (three hand-overs: TilesFull, GatesFull,
//   ChainFull, after which the next chunk's tiles load); each step first stores dS as it enters
//   the chunk (fp32 [num_slots, HV, 128, 128], Params::ds_end_out), and the walk ends with dh0.
//   No h flag: it runs beside the h-walk. Where twice the walks fit the SMs (launch.cu) a walk
//   runs as two CTAs (kSlices), each with 64 of dS's columns (a column warpgroup 32: wgmma
//   N = 32) and dO's, and Q, K, A, G, beta and the gates whole: no product of the recurrence
//   reduces over V's columns, so each CTA's columns of dS and dh0 are the whole walk's bit for
//   bit, at a shorter step on SMs that were idle.
// - the chunk pass (Form::kChunkPass, Params::ds_end): the walk of one chunk, one CTA per
//   (chunk, value head), its dS loaded from ds_end in place of the carried one. Its step is the
//   walk's without the update of dS (eO, gamma dS + Q^T eO + K^T Zs; dh0 comes from the dS-walk),
//   product for product on the same fp32 dS (<dS, h> reads fp32 dS; bf16(dS) is rounded from it
//   as the walk rounds), so every gradient is the walk's. Its dq and dk go through the walk's
//   value-head sums: CTAs by ticket, (slot, value head) with value heads fastest, so that a q/k
//   head's value heads of one slot are adjacent tickets in ascending order, with the walk's turns
//   per (slot, q/k head); the terms of each slot are added in the walk's order, so the sums are
//   the walk's bit for bit. The dS-walk writes neither and takes no ticket.
//
// The decay is the template policy Decay (common/decay.hpp). Above is ScalarDecay (GDN). With
// ChannelDecay (KDA, docs/design/kda-hopper.md; the FP64 model's reverse_step in
// ref/kda_walk_model.hpp) the decay is in kkt_solve's operands: Q, K are qg = Q o e and
// kg = K o e, T = A and P come ready (P by TMA), kbar = K o ebar comes as a tile, and dS decays
// by a factor per row (key channel), so per chunk
//   Rt = V - kg h;  R = beta Rt;  Delta = A R;  dDelta = kbar dS + P^T dO;  Z = A^T dDelta
//   dS <- diag(gamma) dS + qg^T (s dO) - kg^T (beta Z);  dv = beta Z
//   dA = mask(dDelta R^T);  dL = -strict(A^T dA A^T)
// and the walk hands the gated products' adjoints to the intra pass (intra_bwd) instead of
// forming dq, dk and dg: per chunk it writes dL and s mask(dO Delta^T) [64 x 64], dqg = s dO h^T,
// dkg = -(beta Z) h^T and dkbar = Delta dS^T [64 x 128], rowdot(dS, h) per row of h and
// rowdot(Z, Rt) per token. The same roles and hand-overs; the side roles form no gates and no
// row sums for dG, and eO enters as one bf16 product (kbar takes the tile of eO's low part).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/decay.hpp"
#include "kernels/common/gemm.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tensor_map.hpp"
#include "kernels/common/walk.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/walk_a_bwd/params.hpp"

namespace cake::kernels::walk_a_bwd {

using bf16 = __nv_bfloat16;

inline constexpr int kRoleThreads = 128;  // one warpgroup
inline constexpr int kThreads = 4 * kRoleThreads;
inline constexpr int kSideThreads = 2 * kRoleThreads;
// Registers per thread (setmaxnreg; 65,536 per SM over 512 threads): a column warpgroup holds its
// dS share (64), K h and K dS (32 each) and half of Delta (16) at once; a side warpgroup one
// [64 x 64] product (dq or dk, 32).
inline constexpr int kColumnRegs = 176;
inline constexpr int kSideRegs = 80;
static_assert(2 * kRoleThreads * (kColumnRegs + kSideRegs) <= 65536,
              "the roles' registers exceed the SM's");

// One chunk's tiles and row sums; about 221 KB: one CTA per SM. Q, K, V, dO, h and A come by TMA
// and are 128-byte swizzled tiles (each 1024-byte aligned), and so are what is written over K and
// V (eO, dDelta; Zs) and eO's low part; the others are blocked (wgmma.cuh).
template <class Decay>
struct SharedStorage;
template <>
struct alignas(1024) SharedStorage<ScalarDecay> {
  bf16 q[kChunk * kHeadDim];  // [64 x 128] Q, swizzled
  // [2][64 x 128]: K of chunk j in kd[j % 2] (k_of); eO = s e dO, then bf16(dDelta), in the
  // other one (ddelta_of), where K of chunk j - 1 lands once dT has read dDelta: so K loads
  // a phase before the step's end, not after its last product (M K)
  bf16 kd[2][kChunk * kHeadDim];
  bf16 v[kChunk * kHeadDim];         // [64 x 128] V; then Zs = -beta e Z (swizzled)
  bf16 dout[kChunk * kHeadDim];      // [64 x 128] dO, swizzled
  bf16 h[kHeadDim * kHeadDim];       // [128 x 128] the chunk's start state, swizzled
  bf16 ds[kHeadDim * kHeadDim];      // [128 x 128] bf16(dS) of the chunk's end state
  bf16 a[kChunk * kChunk];           // [64 x 64] A, swizzled
  bf16 t[kChunk * kChunk];           // [64 x 64] T = Gamma o A; then dA, then Y
  bf16 p[kChunk * kChunk];           // [64 x 64] P; then dQK
  bf16 r[kChunk * kHeadDim];         // [64 x 128] R; then M [64 x 64]
  bf16 delta[kChunk * kHeadDim];     // [64 x 128] bf16(Delta)
  bf16 delta_eb[kChunk * kHeadDim];  // [64 x 128] eO's low part (eo_split, swizzled); then
                                     // bf16(ebar Delta) (blocked)
  float gcum[kChunk];                // G; rows past the end repeat G of the last token
  float g_prev[kChunk];              // the previous chunk's G, for its E
  float beta[kChunk];                // beta; 0 past the end
  // Row sums in parts, added in ascending part order (deterministic): by column warpgroup
  float kdsd[2 * kChunk];  // <K dS, Delta>
  float zrt[2 * kChunk];   // <Z, Rt>
  // by side warpgroup
  float oqh[2 * kChunk];         // <Q, dO h^T> = <dO, Q h>
  float zkh[2 * kChunk];         // <Zs h^T, K> = -beta e <Z, K h>
  float gate_row_p[2 * kChunk];  // row sums of P o dP (i > j)
  float gate_col_p[4 * kChunk];  // its column sums, by the warp's 16 rows
  // by column warpgroup
  float gate_row_t[2 * kChunk];  // row sums of T o dT (i > j)
  float gate_col_t[4 * kChunk];  // its column sums, by the warp's 16 rows
  float dlk[2 * kChunk];         // <dL K, K>
  float dsh[8];                  // <dS, h>, by column warp
  // The walk's document and value head, read by the roles at each step (read_here)
  WalkSpan span;
  WalkRef walk;
  int32_t ticket;  // this CTA's place in the ticket order (Params::order)
  // mbarriers of the TMA loads (Landed): each tile group loads once per step, so the phase of
  // chunk j's load has parity (num_chunks - 1 - j) % 2 (landed_parity)
  uint64_t landed[5];
};
static_assert(sizeof(SharedStorage<ScalarDecay>) <= 227 * 1024,
              "walk_a_bwd shared memory exceeds 227 KB");
// ChannelDecay: the same tiles where they mean the same (q, k: qg, kg; p: P as TMA leaves it,
// swizzled), kbar in the place of eO's low part and ebar Delta, and the row sums the walk hands on.
template <>
struct alignas(1024) SharedStorage<ChannelDecay> {
  bf16 q[kChunk * kHeadDim];      // [64 x 128] qg, swizzled
  bf16 kd[2][kChunk * kHeadDim];  // kg of chunk j, and eO = s dO then bf16(dDelta) (as above)
  bf16 v[kChunk * kHeadDim];      // [64 x 128] V; then Zs = -beta Z (swizzled)
  bf16 dout[kChunk * kHeadDim];   // [64 x 128] dO, swizzled
  bf16 h[kHeadDim * kHeadDim];    // [128 x 128] the chunk's start state, swizzled
  bf16 ds[kHeadDim * kHeadDim];   // [128 x 128] bf16(dS) of the chunk's end state
  bf16 a[kChunk * kChunk];        // [64 x 64] A (the gated T), swizzled
  bf16 t[kChunk * kChunk];        // [64 x 64] T = A (blocked); then dA, then Y
  bf16 p[kChunk * kChunk];        // [64 x 64] P, swizzled
  bf16 r[kChunk * kHeadDim];      // [64 x 128] R
  bf16 delta[kChunk * kHeadDim];  // [64 x 128] bf16(Delta)
  bf16 kbar[kChunk * kHeadDim];   // [64 x 128] kbar, swizzled
  float glast[kHeadDim];          // G of the chunk's last token, per key channel
  float beta[kChunk];             // beta; 0 past the end
  float zrt[2 * kChunk];          // <Z, Rt> by column warpgroup
  float dsh[2][2 * kHeadDim];     // <dS, h> per row of h, by column warpgroup and chunk parity
                                  // (stored at once: E reads the other parity)
  WalkSpan span;
  WalkRef walk;
  int32_t ticket;
  uint64_t landed[5];
};
static_assert(sizeof(SharedStorage<ChannelDecay>) <= 227 * 1024,
              "walk_a_bwd shared memory exceeds 227 KB with a per-channel decay");
// eO's low part (Params::eo_split; ScalarDecay only)
__device__ __forceinline__ bf16* eo_low(SharedStorage<ScalarDecay>& s) { return s.delta_eb; }
__device__ __forceinline__ bf16* eo_low(SharedStorage<ChannelDecay>&) { return nullptr; }
template <class S>
__device__ __forceinline__ bf16* k_of(S& s, int64_t j) {
  return s.kd[j & 1];
}
template <class S>
__device__ __forceinline__ bf16* ddelta_of(S& s, int64_t j) {
  return s.kd[~j & 1];
}

// The kernel's parameters: the walk's, and the TMA maps (tensor_map.hpp) of Q [BT, H, 128],
// K [BT, H, 128], V and dO [BT, HV, 128], A [BT, HV, 64] (tile maps) and h (the h map);
// ChannelDecay: qg and kg [BT, HV, 128] in Q's and K's, kbar [BT, HV, 128], P [BT, HV, 64].
struct KernelParams {
  Params p;
  TensorMap q_map, k_map, v_map, dout_map, a_map, h_map, kbar_map, aqk_map;
};
// The TMA loads' mbarriers in SharedStorage::landed
enum Landed : int { kDoutLanded = 0, kQhLanded = 1, kALanded = 2, kKLanded = 3, kVLanded = 4 };
template <class S>
__device__ __forceinline__ int landed_parity(S const& s, int64_t j) {
  return static_cast<int>((s.span.num_chunks() - 1 - j) & 1);
}
// Waits until chunk j's load of `which` has landed: its bytes are then this thread's to read
// (the async proxy's writes, through the mbarrier's phase).
template <class S>
__device__ __forceinline__ void wait_landed(S& s, Landed which, int64_t j) {
  mbarrier_wait(&s.landed[which], landed_parity(s, j));
}

// The kernel's forms (above): the walk, and the split form's dS-walk and chunk pass.
enum class Form { kWalk, kDsWalk, kChunkPass };

// Named barriers (0 is __syncthreads, unused here).
enum Barrier : int {
  kColumnGroup0 = 1,  // a column warpgroup alone (128 threads); kColumnGroup0 + 1 the other one
  kSideGroup = 3,     // the two side warpgroups (256)
  kTilesFull = 6,     // side -> column: the chunk's tiles, G and beta landed
  kGatesFull = 7,     // side -> column: T, P, eO (and eO's low part)
  kDeltaFull = 8,     // column -> side: bf16(Delta), bf16(ebar Delta), <K dS, Delta>
  kPFree = 9,         // column -> side: P^T dO done (P may be overwritten)
  kChainFull = 10,    // column -> side: bf16(dDelta), Zs (and the side roles' dq is done)
  kStepDone = 11,     // side -> column: dk has read ds (the next bf16(dS) may be stored)
  kColumnPair = 12,   // the two column warpgroups (256)
  kMFull = 13,        // column -> side: M (and A's readers are done)
  kDdeltaFree = 14,   // column -> side: dT has read dDelta and G (K, V, G and beta may load)
};

// The bf16 pair at element offset `at` of a tile (for_each_blocked_pair's offsets).
__device__ __forceinline__ float2 ld_pair(bf16 const* tile, int at) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(tile + at));
}
__device__ __forceinline__ void st_pair(bf16* tile, int at, float x0, float x1) {
  *reinterpret_cast<__nv_bfloat162*>(tile + at) = __floats2bfloat162_rn(x0, x1);
}

// for_each_blocked_pair over a column warpgroup's share of the state (rows 0 .. 63, then
// 64 .. 127, columns c0 .. c0 + kN - 1) in a blocked [128 x 128] tile.
template <int kN, class F>
__device__ __forceinline__ void for_each_state_blocked_pair(StateCols<kN>& st, int c0, F const& f) {
  for_each_blocked_pair<kHeadDim, kN>(0, c0, st.lo, f);
  for_each_blocked_pair<kHeadDim, kN>(kHeadDim / 2, c0, st.hi, f);
}

// parts[part * 64 + row] <- the row sums whose thread shares are lo (row_lo) and hi (row_lo + 8).
__device__ __forceinline__ void store_row_sums(float lo, float hi, float* parts, int part,
                                               int row_lo) {
  lo = quad_sum(lo);
  hi = quad_sum(hi);
  if (threadIdx.x % 4 == 0) {
    parts[part * kChunk + row_lo] = lo;
    parts[part * kChunk + row_lo + 8] = hi;
  }
}

// This thread's shares of the row dots <x_r, y_r> of two accumulators of one layout.
template <int kN>
__device__ __forceinline__ float2 acc_row_dots(float const (&x)[kN / 2], float const (&y)[kN / 2]) {
  float2 dot = make_float2(0.f, 0.f);
#pragma unroll
  for (int jb = 0; jb < kN / 8; ++jb) {
    dot.x += x[4 * jb] * y[4 * jb] + x[4 * jb + 1] * y[4 * jb + 1];
    dot.y += x[4 * jb + 2] * y[4 * jb + 2] + x[4 * jb + 3] * y[4 * jb + 3];
  }
  return dot;
}

// The row dots of a side warpgroup's [64 x 64] product (columns n0 ..) with those of a swizzled
// [64 x 128] tile, stored as part `part`.
__device__ __forceinline__ void store_tile_row_dots(float const (&acc)[kChunk / 2],
                                                    bf16 const* tile, int n0, float* parts,
                                                    int part, int row_lo) {
  float2 dot = make_float2(0.f, 0.f);
  uint32_t x[kChunk / 4];  // the tile's rows by ldmatrix, in for_each_wgmma_pair's order
  load_swizzled_frag<kChunk, kChunk>(tile, 0, n0, x);
#pragma unroll
  for (int jb = 0; jb < kChunk / 8; ++jb) {
    float2 const lo = bits_float2(x[2 * jb]);
    float2 const hi = bits_float2(x[2 * jb + 1]);
    dot.x += acc[4 * jb] * lo.x + acc[4 * jb + 1] * lo.y;
    dot.y += acc[4 * jb + 2] * hi.x + acc[4 * jb + 3] * hi.y;
  }
  store_row_sums(dot.x, dot.y, parts, part, row_lo);
}

// A warpgroup's [64 x 32] gradient of a gate product X (T or P, columns n0 .. of [64 x 64]):
// with dX = mask(acc) (i >= j), the row sums (part `part`) and column sums (part: the warp's rows)
// of X o dX over i > j, then factor Gamma o dX -> x in place (this warpgroup alone reads and
// writes these columns of x).
inline constexpr int kGateCols = kChunk / 2;
__device__ __forceinline__ void gate_grad(float (&acc)[kGateCols / 2], bf16* x, float factor,
                                          float const* gcum, float* gate_row, float* gate_col,
                                          int n0, int part) {
  int const lane = threadIdx.x % 32;
  int const warp = threadIdx.x % kRoleThreads / 32;
  int const row_lo = 16 * warp + lane / 4;
  float lo = 0.f, hi = 0.f;
  float col[kGateCols / 8][2];
  int const at0 = blocked_offset<kChunk>(row_lo, n0 + 2 * (lane % 4));
#pragma unroll
  for (int jb = 0; jb < kGateCols / 8; ++jb) {
    int const jc = n0 + 8 * jb + 2 * (lane % 4);
    col[jb][0] = 0.f;
    col[jb][1] = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int const i = row_lo + 8 * half;
      int const at = at0 + kNext8Cols * jb + kNext8Rows<kChunk> * half;
      float const d0 = i >= jc ? acc[4 * jb + 2 * half] : 0.f;
      float const d1 = i >= jc + 1 ? acc[4 * jb + 2 * half + 1] : 0.f;
      float2 const xx = ld_pair(x, at);
      float const s0 = i > jc ? xx.x * d0 : 0.f;
      float const s1 = i > jc + 1 ? xx.y * d1 : 0.f;
      float2 const gate = causal_gates(gcum, i, jc);
      st_pair(x, at, factor * gate.x * d0, factor * gate.y * d1);
      (half == 0 ? lo : hi) += s0 + s1;
      col[jb][0] += s0;
      col[jb][1] += s1;
    }
  }
  store_row_sums(lo, hi, gate_row, part, row_lo);
#pragma unroll
  for (int jb = 0; jb < kGateCols / 8; ++jb)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float const sum = column_sum(col[jb][e]);
      if (lane < 4) gate_col[warp * kChunk + n0 + 8 * jb + 2 * lane + e] = sum;
    }
}

// ---- the column roles

// dA = mask(dT) (i >= j) -> x (blocked, columns n0 ..) for ChannelDecay: no gate, and no gate sums
// (the intra pass forms dG).
__device__ __forceinline__ void mask_grad(float (&acc)[kGateCols / 2], bf16* x, int n0) {
  for_each_blocked_pair<kChunk, kGateCols>(
      0, n0, acc, [&](int i, int jc, int at, float& x0, float& x1) {
        st_pair(x, at, i >= jc ? x0 : 0.f, i >= jc + 1 ? x1 : 0.f);
      });
}

// A column warpgroup (wg 0 or 1) of a CTA of kHeadDim / kSlices of dS's columns from col0: the
// kWg = kHeadDim / kSlices / 2 columns c0 = col0 + kWg wg .. c0 + kWg - 1 (64, or 32 in a split
// dS-walk's CTA), walked over the chunks of its document (s.span), last to first. Every product
// here left-multiplies dS or is per column of V (K dS, Q^T eO, P^T dO, T^T dDelta, K^T Zs), so a
// warpgroup's columns need no other's. The dS-walk keeps the chain's products and stores each
// chunk's dS; the chunk pass (s.span is its one chunk) starts from that dS and leaves out the
// update (kUpdate).
template <class Decay, Form kForm, int kSlices>
__device__ __forceinline__ void column_role(SharedStorage<Decay>& s, Params const& p, int wg,
                                            int col0) {
  constexpr bool kChannel = Decay::kGatedKkt;
  constexpr bool kDsWalk = kForm == Form::kDsWalk;
  constexpr bool kUpdate = kForm != Form::kChunkPass;  // dS walks on to the previous chunk
  constexpr int kWg = kHeadDim / kSlices / 2;          // this warpgroup's columns
  constexpr int kHalfRows = kHeadDim / 2;              // the share's hi rows start here
  int const HV = p.problem.num_v_heads;
  int const c0 = col0 + kWg * wg;
  int const group = kColumnGroup0 + wg;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  float const scale = p.problem.scale;
  bool const eo_split = p.eo_split;
  auto const state_offset = [&] {
    WalkRef const w = read_here(s.walk);
    return (int64_t{w.n} * HV + w.hv) * kHeadDim * kHeadDim;
  };
  // dS of chunk j's end in the per-chunk buffers (ds_end)
  auto const chunk_state_offset = [&](int64_t j) {
    int64_t const slot = read_here(s.span).slot0 + j;
    return (slot * HV + read_here(s.walk).hv) * kHeadDim * kHeadDim;
  };
  StateCols<kWg> ds;
  if constexpr (kForm == Form::kChunkPass)
    load_state_half(ds, p.ds_end + chunk_state_offset(0), c0);
  else
    load_state_half(ds, p.dht != nullptr ? p.dht + state_offset() : nullptr, c0);

  for (int64_t j = s.span.num_chunks() - 1; j >= 0; --j) {
    WalkSpan const span = read_here(s.span);
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);
    if constexpr (kDsWalk) store_state_half(ds, p.ds_end_out + chunk_state_offset(j), c0);
    // formed anew at each step, as the side roles' (thread_index_here)
    unsigned const tid = thread_index_here();
    int const warp = tid / 32;  // 0 .. 7
    int const lane = tid % 32;
    int const row_lo = 16 * (warp % 4) + lane / 4;  // this thread's accumulator rows
    int const row_hi = row_lo + 8;
    // bf16(dS) -> ds (this warpgroup's columns), under the side roles' loads
    for_each_state_blocked_pair(
        ds, c0, [&](int, int, int at, float& x0, float& x1) { st_pair(s.ds, at, x0, x1); });
    named_barrier_sync(kTilesFull, kThreads);
    wait_landed(s, kDoutLanded, j);  // landed before TilesFull (the side roles waited)
    wait_landed(s, kQhLanded, j);
    wait_landed(s, kKLanded, j);
    if constexpr (!kDsWalk) wait_landed(s, kVLanded, j);

    // GDN's decays of this thread's rows (ChannelDecay's are in the operands: 1 here)
    float g_last = 0.f;
    float g_lo = 0.f;
    float g_hi = 0.f;
    if constexpr (!kChannel) {
      g_last = s.gcum[len - 1];
      g_lo = s.gcum[row_lo];
      g_hi = s.gcum[row_hi];
    }
    float const e_lo = kChannel ? 1.f : __expf(g_lo);
    float const e_hi = kChannel ? 1.f : __expf(g_hi);
    float const eb_lo = kChannel ? 1.f : __expf(g_last - g_lo);
    float const eb_hi = kChannel ? 1.f : __expf(g_last - g_hi);
    float const b_lo = s.beta[row_lo];
    float const b_hi = s.beta[row_hi];
    auto const by_row = [&](int r, float lo, float hi) { return r == row_lo ? lo : hi; };

    // <dS, h> over this warpgroup's share (dS as it enters the chunk); stored after GatesFull,
    // once the side roles' E of the previous chunk has read the slot. ChannelDecay: by rows of h
    // (a row's 64 columns here are a quad's: rows row_lo, row_hi of each half), stored at once
    float dsh = 0.f;
    if constexpr (!kDsWalk) {  // (the dS-walk has no h)
      float dsh_rows[2][2] = {};
#pragma unroll
      for (int part = 0; part < 2; ++part) {  // h's rows 0 .. 63 (ds.lo), then 64 .. 127 (ds.hi)
        float const(&acc)[kWg / 2] = part == 0 ? ds.lo : ds.hi;
        uint32_t hf[kWg / 4];  // by ldmatrix, in for_each_wgmma_pair's order
        load_swizzled_frag<kHeadDim, kWg>(s.h, kHalfRows * part, c0, hf);
#pragma unroll
        for (int q = 0; q < kWg / 4; ++q) {
          float2 const hh = bits_float2(hf[q]);
          if constexpr (kChannel)
            dsh_rows[part][q % 2] += acc[2 * q] * hh.x + acc[2 * q + 1] * hh.y;
          else
            dsh += acc[2 * q] * hh.x + acc[2 * q + 1] * hh.y;
        }
      }
      if constexpr (kChannel) {
        float* const out = s.dsh[j & 1] + wg * kHeadDim;
#pragma unroll
        for (int part = 0; part < 2; ++part) {
          float const lo = quad_sum(dsh_rows[part][0]);
          float const hi = quad_sum(dsh_rows[part][1]);
          if (lane % 4 == 0) {
            out[kHalfRows * part + row_lo] = lo;
            out[kHalfRows * part + row_hi] = hi;
          }
        }
      } else {
        for (int d = 16; d > 0; d /= 2) dsh += __shfl_xor_sync(0xffffffffu, dsh, d);
      }
    }
    // eO = s e dO -> ddelta on this warpgroup's columns; with an initial state
    // (Params::eo_split) its rounding residual -> delta_eb
    // By fragments (ldmatrix, stmatrix), in two halves of the warpgroup's columns (registers):
    // pair q of a half is row_lo (even q) or row_hi (odd q). (Only the update reads eO.)
    if constexpr (kUpdate) {
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        int const n0 = c0 + kWg / 2 * part;
        uint32_t frag[kWg / 8];
        load_swizzled_frag<kChunk, kWg / 2>(s.dout, 0, n0, frag);
        uint32_t lo[kWg / 8];  // eO's rounding residual (eo_split)
#pragma unroll
        for (int q = 0; q < kWg / 8; ++q) {
          float const se = scale * (q % 2 == 0 ? e_lo : e_hi);
          float2 const d = bits_float2(frag[q]);
          __nv_bfloat162 const eo = __floats2bfloat162_rn(se * d.x, se * d.y);
          float2 const hi = __bfloat1622float2(eo);
          lo[q] = bf16x2_bits(__floats2bfloat162_rn(se * d.x - hi.x, se * d.y - hi.y));
          frag[q] = bf16x2_bits(eo);
        }
        store_swizzled_frag<kChunk, kWg / 2>(ddelta_of(s, j), 0, n0, frag);
        if constexpr (!kChannel)
          if (eo_split) store_swizzled_frag<kChunk, kWg / 2>(s.delta_eb, 0, n0, lo);
      }
    }
    fence_proxy_async_shared();
    named_barrier_sync(group, kRoleThreads);  // bf16(dS) and eO's columns complete

    // K h, then K dS and dS <- gamma dS + Q^T eO (K^T Zs follows at the end); ChannelDecay:
    // kg h, kbar dS, dS <- diag(gamma) dS + qg^T eO
    if constexpr (kUpdate) {
      if constexpr (kChannel) {
        decay_rows(ds, s.glast, c0);
      } else {
        float const gamma = __expf(g_last);
        for (float& x : ds.lo) x *= gamma;
        for (float& x : ds.hi) x *= gamma;
      }
    }
    float kh[kWg / 2] = {};
    float kds[kWg / 2] = {};
    fence_accumulators(kh);
    fence_accumulators(kds);
    fence_accumulators(ds.lo);
    fence_accumulators(ds.hi);
    wgmma_fence();
    if constexpr (!kDsWalk) {
      warpgroup_mma_async<kWg, kHeadDim>(KMajorSwizzledTile<kChunk>{k_of(s, j)},
                                         MNMajorSwizzledTile<kHeadDim>{s.h}, 0, c0, kh);
      wgmma_commit();
    }
    if constexpr (kChannel)
      warpgroup_mma_async<kWg, kHeadDim>(KMajorSwizzledTile<kChunk>{s.kbar},
                                         MNMajorTile<kHeadDim>{s.ds}, 0, c0, kds);
    else
      warpgroup_mma_async<kWg, kHeadDim>(KMajorSwizzledTile<kChunk>{k_of(s, j)},
                                         MNMajorTile<kHeadDim>{s.ds}, 0, c0, kds);
    if constexpr (kUpdate)
      for (int part = 0; part < (eo_split ? 2 : 1); ++part) {
        bf16 const* const eo = part == 0 ? ddelta_of(s, j) : eo_low(s);
        warpgroup_mma_async<kWg, kChunk>(MNMajorSwizzledTile<kChunk>{s.q},
                                         MNMajorSwizzledTile<kChunk>{eo}, 0, c0, ds.lo);
        warpgroup_mma_async<kWg, kChunk>(MNMajorSwizzledTile<kChunk>{s.q},
                                         MNMajorSwizzledTile<kChunk>{eo}, kHalfRows, c0, ds.hi);
      }
    wgmma_commit();
    // R = beta (V - e (K h)) -> r; K h stays in registers (fp32) for <Z, K h> below. V by
    // fragments (ldmatrix), pair q at row_lo (even q) or row_hi (odd q); R stored by stmatrix
    if constexpr (!kDsWalk) {
      wgmma_wait<1>();
      fence_accumulators(kh);
#pragma unroll
      for (int part = 0; part < 2; ++part) {
        int const n0 = c0 + kWg / 2 * part;
        uint32_t frag[kWg / 8];
        load_swizzled_frag<kChunk, kWg / 2>(s.v, 0, n0, frag);
#pragma unroll
        for (int q = 0; q < kWg / 8; ++q) {
          float const e = q % 2 == 0 ? e_lo : e_hi;
          float const b = q % 2 == 0 ? b_lo : b_hi;
          float2 const vv = bits_float2(frag[q]);
          float const x0 = kh[kWg / 4 * part + 2 * q];
          float const x1 = kh[kWg / 4 * part + 2 * q + 1];
          frag[q] = bf16x2_bits(__floats2bfloat162_rn(b * (vv.x - e * x0), b * (vv.y - e * x1)));
        }
        store_blocked_frag<kHeadDim, kWg / 2>(s.r, 0, n0, frag);
      }
    }
    fence_proxy_async_shared();
    wgmma_wait<0>();
    fence_accumulators(kds);
    fence_accumulators(ds.lo);
    fence_accumulators(ds.hi);
    named_barrier_sync(kGatesFull, kThreads);  // T, P, E's reads; also R's columns here
    if constexpr (!kChannel && !kDsWalk)
      if (lane == 0) s.dsh[warp] = dsh;

    // Delta = T R in two [64 x 32] halves (registers: a column warpgroup holds dS, Rt and K dS):
    // <K dS, Delta> by rows (both fp32), bf16(Delta) -> delta, bf16(ebar Delta) -> delta_eb
    if constexpr (!kDsWalk) {
      float2 dot = make_float2(0.f, 0.f);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        int const n0 = c0 + kWg / 2 * half;
        float d[kWg / 4] = {};
        warpgroup_mma<kWg / 2, kChunk>(KMajorTile<kChunk>{s.t}, MNMajorTile<kHeadDim>{s.r}, 0, n0,
                                       d);
        if constexpr (kChannel) {
          for_each_blocked_pair<kHeadDim, kWg / 2>(
              0, n0, d,
              [&](int, int, int at, float& x0, float& x1) { st_pair(s.delta, at, x0, x1); });
        } else {
#pragma unroll
          for (int e = 0; e < kWg / 4; ++e) {
            float const x = d[e] * kds[kWg / 4 * half + e];
            (e % 4 < 2 ? dot.x : dot.y) += x;
          }
          for_each_blocked_pair<kHeadDim, kWg / 2>(0, n0, d,
                                                   [&](int r, int, int at, float& x0, float& x1) {
                                                     float const eb = by_row(r, eb_lo, eb_hi);
                                                     st_pair(s.delta, at, x0, x1);
                                                     st_pair(s.delta_eb, at, eb * x0, eb * x1);
                                                   });
        }
      }
      if constexpr (!kChannel) store_row_sums(dot.x, dot.y, s.kdsd, wg, row_lo);
      fence_proxy_async_shared();
      named_barrier_arrive(kDeltaFull, kThreads);
    }

    // dDelta = ebar (K dS) + P^T dO (ChannelDecay: kbar dS + P^T dO, P as TMA left it)
    if constexpr (kChannel) {
      wait_landed(s, kALanded, j);  // P lands with A (before GatesFull: the side roles waited)
      warpgroup_mma<kWg, kChunk>(MNMajorSwizzledTile<kChunk>{s.p},
                                 MNMajorSwizzledTile<kChunk>{s.dout}, 0, c0, kds);
    } else {
      for_each_wgmma_pair<kWg>(0, c0, kds, [&](int r, int, float& x0, float& x1) {
        float const eb = by_row(r, eb_lo, eb_hi);
        x0 *= eb;
        x1 *= eb;
      });
      warpgroup_mma<kWg, kChunk>(MNMajorTile<kChunk>{s.p}, MNMajorSwizzledTile<kChunk>{s.dout}, 0,
                                 c0, kds);
    }
    if constexpr (!kDsWalk) {
      named_barrier_arrive(kPFree, kThreads);
    }
    // bf16(dDelta) -> ddelta (this warpgroup's eO columns are read); Z's diagonal term
    // T_ii dDelta_i (T_ii = 1) in fp32: the rounding residual stays in kds, Z's accumulator
#pragma unroll
    for (int part = 0; part < 2; ++part) {  // by stmatrix, in halves of its columns
      uint32_t frag[kWg / 8];
#pragma unroll
      for (int q = 0; q < kWg / 8; ++q) {
        float& x0 = kds[kWg / 4 * part + 2 * q];
        float& x1 = kds[kWg / 4 * part + 2 * q + 1];
        __nv_bfloat162 const d = __floats2bfloat162_rn(x0, x1);
        frag[q] = bf16x2_bits(d);
        float2 const df = __bfloat1622float2(d);
        x0 -= df.x;
        x1 -= df.y;
      }
      store_swizzled_frag<kChunk, kWg / 2>(ddelta_of(s, j), 0, c0 + kWg / 2 * part, frag);
    }
    fence_proxy_async_shared();
    named_barrier_sync(group, kRoleThreads);
    float(&z)[kWg / 2] = kds;  // Z = T^T dDelta
    warpgroup_mma<kWg, kChunk>(MNMajorTile<kChunk>{s.t},
                               MNMajorSwizzledTile<kChunk>{ddelta_of(s, j)}, 0, c0, z);
    {  // <Z, K h> and <Z, V> by rows (fp32), for dbeta's <Z, Rt> = <Z, V> - e <Z, K h> and dg's
       // <Zs h^T, K> = -beta e <Z, K h> (formed from K h, not Rt = V - e (K h): under strong
       // decay e (K h) is below Rt's rounding of V, and dg ~ e^G); Zs = -beta e Z -> v (this
       // warpgroup's V is read; the dS-walk forms Zs alone, into the tile V would have had)
      float2 zv = make_float2(0.f, 0.f);
#pragma unroll
      for (int part = 0; part < 2; ++part) {  // V and Zs by fragments, in column halves
        int const n0 = c0 + kWg / 2 * part;
        uint32_t frag[kWg / 8];
        if constexpr (!kDsWalk) load_swizzled_frag<kChunk, kWg / 2>(s.v, 0, n0, frag);
#pragma unroll
        for (int q = 0; q < kWg / 8; ++q) {
          float const be = q % 2 == 0 ? b_lo * e_lo : b_hi * e_hi;
          float const x0 = z[kWg / 4 * part + 2 * q];
          float const x1 = z[kWg / 4 * part + 2 * q + 1];
          if constexpr (!kDsWalk) {
            float2 const vv = bits_float2(frag[q]);
            (q % 2 == 0 ? zv.x : zv.y) += x0 * vv.x + x1 * vv.y;
          }
          frag[q] = bf16x2_bits(__floats2bfloat162_rn(-be * x0, -be * x1));
        }
        store_swizzled_frag<kChunk, kWg / 2>(s.v, 0, n0, frag);
      }
      if constexpr (!kDsWalk) {
        float2 const zkh = acc_row_dots<kWg>(z, kh);
        store_row_sums(zv.x - e_lo * zkh.x, zv.y - e_hi * zkh.y, s.zrt, wg, row_lo);
        if constexpr (!kChannel)
          store_row_sums(-b_lo * e_lo * zkh.x, -b_hi * e_hi * zkh.y, s.zkh, wg, row_lo);
      }
    }
    fence_proxy_async_shared();
    named_barrier_sync(group, kRoleThreads);
    named_barrier_arrive(kChainFull, kThreads);

    // dS += K^T Zs: dS of the previous chunk's end; dv = beta Z while it runs
    fence_accumulators(ds.lo);
    fence_accumulators(ds.hi);
    wgmma_fence();
    if constexpr (kUpdate) {
      warpgroup_mma_async<kWg, kChunk>(MNMajorSwizzledTile<kChunk>{k_of(s, j)},
                                       MNMajorSwizzledTile<kChunk>{s.v}, 0, c0, ds.lo);
      warpgroup_mma_async<kWg, kChunk>(MNMajorSwizzledTile<kChunk>{k_of(s, j)},
                                       MNMajorSwizzledTile<kChunk>{s.v}, kHalfRows, c0, ds.hi);
    }
    wgmma_commit();
    if (!kDsWalk && p.dv != nullptr) {
      bf16* const dv =
          p.dv + ((t0 + row_lo) * HV + read_here(s.walk).hv) * kHeadDim + c0 + 2 * (lane % 4);
      store_wgmma_rows<kWg>(dv, v_stride, row_lo, len, z, [&](float x0, float x1, bool hi) {
        float const b = hi ? b_hi : b_lo;
        return __floats2bfloat162_rn(b * x0, b * x1);
      });
    }
    wgmma_wait<0>();
    fence_accumulators(ds.lo);
    fence_accumulators(ds.hi);
    // The dS-walk's step ends here: the side roles read neither ds nor what follows, and the
    // next step's TilesFull orders its tiles
    if constexpr (kDsWalk) continue;

    // The [64 x 64] chain dT -> dA -> Y -> dL -> M, columns n0 .. n0 + 31 of each product per
    // warpgroup, while the side roles form dk's other terms.
    int const n0 = kGateCols * wg;
    named_barrier_sync(kColumnPair, 2 * kRoleThreads);  // all of dDelta; every reader of T (Z) done
    {  // dT = mask(dDelta R^T): gate sums of T o dT, dA = Gamma o dT -> t
      float dt[kGateCols / 2] = {};
      warpgroup_mma<kGateCols, kHeadDim>(KMajorSwizzledTile<kChunk>{ddelta_of(s, j)},
                                         KMajorTile<kHeadDim>{s.r}, 0, n0, dt);
      if constexpr (kChannel)
        mask_grad(dt, s.t, n0);
      else
        gate_grad(dt, s.t, 1.f, s.gcum, s.gate_row_t, s.gate_col_t, n0, wg);
    }
    named_barrier_arrive(kDdeltaFree, kThreads);
    fence_proxy_async_shared();
    named_barrier_sync(group, kRoleThreads);  // this warpgroup's columns of dA
    {  // Y = A^T dA -> t, over dA's columns once the product has read them (they are this
       // warpgroup's alone)
      float y[kGateCols / 2] = {};
      wait_landed(s, kALanded, j);  // landed before GatesFull (the side roles' T waited)
      warpgroup_mma<kGateCols, kChunk>(MNMajorSwizzledTile<kChunk>{s.a}, MNMajorTile<kChunk>{s.t},
                                       0, n0, y);
      for_each_blocked_pair<kChunk, kGateCols>(
          0, n0, y, [&](int, int, int at, float& x0, float& x1) { st_pair(s.t, at, x0, x1); });
    }
    fence_proxy_async_shared();
    named_barrier_sync(kColumnPair, 2 * kRoleThreads);  // all of Y; every reader of R (dT) done
    if constexpr (kChannel) {  // dL = -strict(Y A^T) -> p.dl (fp32 rows of the chunk)
      float dl[kGateCols / 2] = {};
      warpgroup_mma<kGateCols, kChunk>(KMajorTile<kChunk>{s.t}, KMajorSwizzledTile<kChunk>{s.a}, 0,
                                       n0, dl);
      float* const out =
          p.dl + ((t0 + row_lo) * HV + read_here(s.walk).hv) * kChunk + n0 + 2 * (lane % 4);
      for_each_wgmma_pair<kGateCols>(0, n0, dl, [&](int i, int jc, float& x0, float& x1) {
        x0 = jc < i ? -x0 : 0.f;
        x1 = jc + 1 < i ? -x1 : 0.f;
      });
      store_wgmma_rows<kGateCols>(out, int64_t{HV} * kChunk, row_lo, len, dl,
                                  [](float x0, float x1, bool) { return make_float2(x0, x1); });
    } else {  // dL = -strict(Y A^T); M = beta dL -> m; <dL K, K>_i = sum_j dL_ij (K K^T)_ij by rows
      float dl[kGateCols / 2] = {};
      float kk[kGateCols / 2] = {};
      fence_accumulators(dl);
      fence_accumulators(kk);
      wgmma_fence();
      warpgroup_mma_async<kGateCols, kChunk>(KMajorTile<kChunk>{s.t},
                                             KMajorSwizzledTile<kChunk>{s.a}, 0, n0, dl);
      warpgroup_mma_async<kGateCols, kHeadDim>(KMajorSwizzledTile<kChunk>{k_of(s, j)},
                                               KMajorSwizzledTile<kChunk>{k_of(s, j)}, 0, n0, kk);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(dl);
      fence_accumulators(kk);
      bf16* const m = s.r;  // M, [64 x 64]
      float lo = 0.f, hi = 0.f;
      int const at0 = blocked_offset<kChunk>(row_lo, n0 + 2 * (lane % 4));
#pragma unroll
      for (int jb = 0; jb < kGateCols / 8; ++jb)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          int const i = row_lo + 8 * half;
          int const jc = n0 + 8 * jb + 2 * (lane % 4);
          int const at = at0 + kNext8Cols * jb + kNext8Rows<kChunk> * half;
          int const e = 4 * jb + 2 * half;
          float const d0 = jc < i ? -dl[e] : 0.f;
          float const d1 = jc + 1 < i ? -dl[e + 1] : 0.f;
          (half == 0 ? lo : hi) += d0 * kk[e] + d1 * kk[e + 1];
          float const b = half == 0 ? b_lo : b_hi;
          st_pair(m, at, b * d0, b * d1);
        }
      store_row_sums(lo, hi, s.dlk, wg, row_lo);
    }
    fence_proxy_async_shared();
    named_barrier_arrive(kMFull, kThreads);
    named_barrier_sync(kStepDone, kThreads);
  }
  if (kUpdate && p.dh0 != nullptr) store_state_half(ds, p.dh0 + state_offset(), c0);
}

// ---- the side roles

// The side warpgroups' copies (tid 0 .. 255) of the tiles of the chunk at t0 of len tokens (q/k
// head h, value head hv): G and beta as a cp.async group (beta zero past the end, G repeating its
// last token's); K, V, dO, Q with h, and A by TMA, issued by thread 0 and completing on their
// mbarriers (a box reads whole chunks: rows past the end are zeroed once landed,
// zero_rows_past_end). The walk's first step loads its chunk's tiles at its start; every later
// chunk's tiles load during the step before, each group as soon as its tiles' last reader there
// is done (side_role), so that a step starts on tiles that have landed.

// (dO's columns col0 .. col0 + kCols - 1: all, or a split dS-walk's CTA's 64)
template <int kCols, class S>
__device__ __forceinline__ void load_dout(S& s, KernelParams const& kp, int64_t t0, int hv,
                                          int col0, int tid) {
  static_assert(kCols % 64 == 0, "dO comes in boxes of 64 columns (col0 a multiple of 64)");
  if (tid != 0) return;
  uint64_t* const bar = &s.landed[kDoutLanded];
  mbarrier_arrive_expect_tx(bar, kChunk * kCols * 2);
  // boxes of 64 columns, kChunk x 64 elements apart
  for (int half = col0 / 64; half < (col0 + kCols) / 64; ++half)
    tma_load_2d(s.dout + half * kChunk * 64, &kp.dout_map, hv * kHeadDim + 64 * half,
                static_cast<int>(t0), bar);
}
// (ChannelDecay: P with A, into p)
template <class Decay>
__device__ __forceinline__ void load_a(SharedStorage<Decay>& s, KernelParams const& kp, int64_t t0,
                                       int hv, int tid) {
  if (tid != 0) return;
  uint64_t* const bar = &s.landed[kALanded];
  mbarrier_arrive_expect_tx(bar, (Decay::kGatedKkt ? 2 : 1) * kChunk * kChunk * 2);
  tma_load_2d(s.a, &kp.a_map, hv * kChunk, static_cast<int>(t0), bar);
  if constexpr (Decay::kGatedKkt)
    tma_load_2d(s.p, &kp.aqk_map, hv * kChunk, static_cast<int>(t0), bar);
}
// (h: Q's head in q_map, the value head with ChannelDecay: qg; the dS-walk (kWithH false) loads
// Q alone)
template <bool kWithH, class S>
__device__ __forceinline__ void load_q_h(S& s, KernelParams const& kp, int64_t t0, int64_t slot,
                                         int h, int hv, int tid) {
  if (tid != 0) return;
  uint64_t* const bar = &s.landed[kQhLanded];
  mbarrier_arrive_expect_tx(bar, (kChunk + (kWithH ? kHeadDim : 0)) * kHeadDim * 2);
  int const state = static_cast<int>(slot * kp.p.problem.num_v_heads + hv);
  for (int half = 0; half < 2; ++half) {
    tma_load_2d(s.q + half * kChunk * 64, &kp.q_map, h * kHeadDim + 64 * half, static_cast<int>(t0),
                bar);
    if constexpr (kWithH)
      tma_load_3d(s.h + half * kHeadDim * 64, &kp.h_map, 64 * half, 0, state, bar);
  }
}
// (ChannelDecay: G's last row for G, glast, of chunk j of the walk; the dS-walk (kWithV false)
// loads G and beta alone)
template <bool kWithV, class Decay>
__device__ __forceinline__ void load_v_g_beta(SharedStorage<Decay>& s, KernelParams const& kp,
                                              int64_t t0, int len, int hv, int64_t j, int tid) {
  Params const& p = kp.p;
  if (kWithV && tid == 0) {
    uint64_t* const bar = &s.landed[kVLanded];
    mbarrier_arrive_expect_tx(bar, kChunk * kHeadDim * 2);
    for (int half = 0; half < 2; ++half)
      tma_load_2d(s.v + half * kChunk * 64, &kp.v_map, hv * kHeadDim + 64 * half,
                  static_cast<int>(t0), bar);
  }
  if constexpr (Decay::kGatedKkt)
    load_glast_beta_async(s.glast, s.beta, p.glast, p.beta, t0, len, p.problem.num_v_heads, hv,
                          read_here(s.span).slot0 + j, tid);
  else
    load_gcum_beta_async(s.gcum, s.beta, p.gcum, p.beta, t0, len, p.problem.num_v_heads, hv, tid);
  cp_async_commit();
}
// (h: K's head in k_map, the value head with ChannelDecay: kg, and kbar with it)
template <class Decay>
__device__ __forceinline__ void load_k(SharedStorage<Decay>& s, bf16* k, KernelParams const& kp,
                                       int64_t t0, int h, int tid) {
  if (tid != 0) return;
  uint64_t* const bar = &s.landed[kKLanded];
  mbarrier_arrive_expect_tx(bar, (Decay::kGatedKkt ? 2 : 1) * kChunk * kHeadDim * 2);
  for (int half = 0; half < 2; ++half) {
    tma_load_2d(k + half * kChunk * 64, &kp.k_map, h * kHeadDim + 64 * half, static_cast<int>(t0),
                bar);
    if constexpr (Decay::kGatedKkt)
      tma_load_2d(s.kbar + half * kChunk * 64, &kp.kbar_map, h * kHeadDim + 64 * half,
                  static_cast<int>(t0), bar);
  }
}

// E (one warp; lane l: rows l and l + 32) of the chunk at t0 of len tokens: dbeta, dG and its
// reverse cumsum dg from the chunk's row sums and G (g_prev), which stay in shared memory until
// the next chunk's GatesFull.
__device__ __forceinline__ void finish_rows(SharedStorage<ScalarDecay> const& s, Params const& p,
                                            int64_t t0, int len, int hv) {
  int const lane = threadIdx.x % 32;
  int const HV = p.problem.num_v_heads;
  float const scale = p.problem.scale;
  float const g_last = s.g_prev[len - 1];
  float dg_row[2], dbeta_row[2], tail = 0.f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int const i = lane + 32 * half;
    float const gi = s.g_prev[i];
    float const e = __expf(gi);
    float const kd = sum_parts<kChunk, 2>(s.kdsd, i);
    float const t_i = i < len - 1 ? __expf(g_last - gi) * kd : 0.f;
    dbeta_row[half] = sum_parts<kChunk, 2>(s.zrt, i) + sum_parts<kChunk, 2>(s.dlk, i);
    dg_row[half] = e * scale * sum_parts<kChunk, 2>(s.oqh, i) + sum_parts<kChunk, 2>(s.zkh, i) +
                   sum_parts<kChunk, 2>(s.gate_row_p, i) + sum_parts<kChunk, 2>(s.gate_row_t, i) -
                   sum_parts<kChunk, 4>(s.gate_col_p, i) - sum_parts<kChunk, 4>(s.gate_col_t, i) -
                   t_i;
    tail += t_i;
  }
  for (int d = 16; d > 0; d /= 2) tail += __shfl_xor_sync(0xffffffffu, tail, d);
  float const dsh = sum_parts<1, 8>(s.dsh, 0);
  float const extra = __expf(g_last) * dsh + tail;  // the last row's terms through G_last
  if (lane == len - 1) dg_row[0] += extra;
  if (lane + 32 == len - 1) dg_row[1] += extra;
  // dg_i = sum over rows r >= i of dG_r: suffix sums of the upper half, then the lower half
  // plus the upper half's total
  float hi = dg_row[1];
  float lo = dg_row[0];
  for (int d = 1; d < 32; d *= 2) {
    float const a = __shfl_down_sync(0xffffffffu, hi, d);
    float const b = __shfl_down_sync(0xffffffffu, lo, d);
    if (lane + d < 32) {
      hi += a;
      lo += b;
    }
  }
  lo += __shfl_sync(0xffffffffu, hi, 0);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int const i = lane + 32 * half;
    if (i < len) {
      int64_t const row = (t0 + i) * HV + hv;
      if (p.dg != nullptr) p.dg[row] = half == 0 ? lo : hi;
      if (p.dbeta == nullptr) continue;
      if (p.dbeta_is_bf16)
        static_cast<bf16*>(p.dbeta)[row] = __float2bfloat16(dbeta_row[half]);
      else
        static_cast<float*>(p.dbeta)[row] = dbeta_row[half];
    }
  }
}

// E with ChannelDecay (one warp): what the walk hands the intra pass from its row sums, of the
// chunk at t0 of len tokens in slot `slot`: rowdot(Z, Rt) per token, rowdot(dS, h) per row of h.
// (slot_parity: the chunk's index in its document, mod 2)
__device__ __forceinline__ void finish_rows(SharedStorage<ChannelDecay> const& s, Params const& p,
                                            int64_t t0, int len, int hv, int64_t slot,
                                            int slot_parity) {
  int const lane = threadIdx.x % 32;
  int const HV = p.problem.num_v_heads;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int const i = lane + 32 * half;
    if (i < len) p.dbeta_walk[(t0 + i) * HV + hv] = sum_parts<kChunk, 2>(s.zrt, i);
  }
#pragma unroll
  for (int m = 0; m < kHeadDim / 32; ++m) {
    int const r = lane + 32 * m;
    p.dgamma[(slot * HV + hv) * kHeadDim + r] = sum_parts<kHeadDim, 2>(s.dsh[slot_parity], r);
  }
}

// A side thread's indices (tid 0 .. 255; warpgroup ow = tid / 128: columns n0 = 32 ow .. of the
// [64 x 64] products, k0 = 64 ow .. of dq and dk) and chunk j's place, formed in each phase of a
// step where they are used (thread_index_here, read_here). With 80 registers, what a step keeps
// from its start to its end is kept in local memory, and with ~221 KB of shared memory each
// reload is an L2 round trip: kept, the offsets of the ~40 tile copies per step spill (~130 spill
// instructions per step and warp), and so do the step's t0, len and heads (docs/perf-notes.md).
struct SideHere {
  int tid, ow, warp, lane, row_lo, n0, k0;
  int hv;      // value head
  int64_t t0;  // the chunk's first token
  int len;     // its tokens
};
template <class S>
__device__ __forceinline__ SideHere side_here(S const& s, int64_t j) {
  SideHere x;
  x.tid = static_cast<int>(thread_index_here() % kSideThreads);  // threadIdx.x - 256
  x.ow = x.tid / kRoleThreads;
  x.warp = x.tid / 32;  // 0 .. 7
  x.lane = x.tid % 32;
  x.row_lo = 16 * (x.warp % 4) + x.lane / 4;
  x.n0 = kGateCols * x.ow;
  x.k0 = kStateHalf * x.ow;
  x.hv = read_here(s.walk).hv;
  WalkSpan const span = read_here(s.span);
  x.t0 = span.begin + j * kChunk;
  x.len = span.chunk_len(j);
  return x;
}

// The two side warpgroups of a CTA of kHeadDim / kSlices of dS's columns from col0. Each phase of
// a step forms its indices anew (side_here). In the dS-walk they load the tiles (dO's columns of
// the CTA; Q, K, A, G and beta whole, as both CTAs of a split walk need them) and form the gates
// (whole in each CTA), and nothing else; the chunk pass's are the walk's.
template <class Decay, Form kForm, int kSlices>
__device__ __forceinline__ void side_role(SharedStorage<Decay>& s, KernelParams const& kp,
                                          int col0) {
  constexpr bool kChannel = Decay::kGatedKkt;
  constexpr bool kDsWalk = kForm == Form::kDsWalk;
  constexpr int kCols = kHeadDim / kSlices;
  Params const& p = kp.p;
  int const HV = p.problem.num_v_heads;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  float const scale = p.problem.scale;
  // acc's rows of chunk j (columns k0 ..) -> out's rows (fp32 [BT, HV, K]: the intra pass's
  // inputs, ChannelDecay)
  auto const store_rows = [&](float* out, SideHere const& x, float(&acc)[kStateHalf / 2]) {
    out += ((x.t0 + x.row_lo) * HV + x.hv) * kHeadDim + x.k0 + 2 * (x.lane % 4);
    store_wgmma_rows<kStateHalf>(out, v_stride, x.row_lo, x.len, acc,
                                 [](float x0, float x1, bool) { return make_float2(x0, x1); });
  };
  // acc's rows of chunk j (columns k0 ..) into the sum over the group's value heads (dq, dk; fp32
  // [BT, H, K]), in ascending value-head order: the group's first value head stores its terms,
  // each next one waits for its turn on the chunk's block (turns [num_slots, H], the slot of
  // chunk j), adds its terms at L2 and passes the turn on (turns: dq's or dk's, kDqTurns or
  // kDkTurns). With Params::unordered_sum every value head adds its terms at once, into sums
  // zeroed before the launch.
  auto const reduce_rows = [&](float* out, int turns, SideHere const& x, int64_t slot,
                               float(&acc)[kStateHalf / 2]) {
    int const group = p.problem.group_size();
    int const H = p.problem.num_qk_heads;
    int const gi = x.hv % group;
    bool const ordered = !p.unordered_sum;
    int* const turn = ordered && (gi > 0 || gi + 1 < group)
                          ? p.order + 1 + (turns * p.problem.num_slots + slot) * H + x.hv / group
                          : nullptr;
    out += ((x.t0 + x.row_lo) * H + x.hv / group) * kHeadDim + x.k0 + 2 * (x.lane % 4);
    int64_t const stride = int64_t{H} * kHeadDim;
    if (ordered && gi == 0) {
      store_wgmma_rows<kStateHalf>(out, stride, x.row_lo, x.len, acc,
                                   [](float x0, float x1, bool) { return make_float2(x0, x1); });
    } else {
      if (ordered) {
        if (x.tid == 0) wait_turn(turn, gi);
        named_barrier_sync(kSideGroup, kSideThreads);
      }
#pragma unroll
      for (int jb = 0; jb < kStateHalf / 8; ++jb) {
        if (x.row_lo < x.len) reduce_add_f32x2(out + 8 * jb, acc[4 * jb], acc[4 * jb + 1]);
        if (x.row_lo + 8 < x.len)
          reduce_add_f32x2(out + 8 * stride + 8 * jb, acc[4 * jb + 2], acc[4 * jb + 3]);
      }
    }
    if (ordered && gi + 1 < group) {  // every side thread's terms are in before the turn passes
      named_barrier_sync(kSideGroup, kSideThreads);
      if (x.tid == 0) pass_turn(turn, gi + 1);
    }
  };

  int64_t const num_chunks = s.span.num_chunks();
  for (int64_t j = num_chunks - 1; j >= 0; --j) {
    {  // the walk's first chunk's tiles (later ones load during the step before)
      SideHere const x = side_here(s, j);
      if (j == num_chunks - 1) {
        int const hk = kChannel ? x.hv : x.hv / p.problem.group_size();  // Q's and K's head
        load_dout<kCols>(s, kp, x.t0, x.hv, col0, x.tid);
        load_a(s, kp, x.t0, x.hv, x.tid);
        load_q_h<!kDsWalk>(s, kp, x.t0, read_here(s.span).slot0 + j, hk, x.hv, x.tid);
        load_v_g_beta<!kDsWalk>(s, kp, x.t0, x.len, x.hv, j, x.tid);
        load_k(s, k_of(s, j), kp, x.t0, hk, x.tid);
      }
    }
    // every tile but A (loaded last, after MFull: its first reader is T below)
    cp_async_wait<0>();  // G and beta
    wait_landed(s, kDoutLanded, j);
    wait_landed(s, kQhLanded, j);
    wait_landed(s, kKLanded, j);
    if constexpr (!kDsWalk) wait_landed(s, kVLanded, j);
    if (j == num_chunks - 1) {  // the walk's first step: the only chunk that can be short
      SideHere const x = side_here(s, j);
      for (bf16* tile : {s.q, k_of(s, j), s.v, s.dout})
        zero_rows_past_end<kSideThreads>(tile, kHeadDim, x.len, x.tid);
      if constexpr (kChannel) zero_rows_past_end<kSideThreads>(s.kbar, kHeadDim, x.len, x.tid);
    }
    fence_proxy_async_shared();
    named_barrier_sync(kSideGroup, kSideThreads);
    named_barrier_arrive(kTilesFull, kThreads);
    // E of the previous chunk (warp 0) under the column roles' first phase: the row sums it
    // reads are written again after GatesFull (the column roles' <dS, h> waits for it too)
    if (!kDsWalk && j + 1 < num_chunks) {
      SideHere const x = side_here(s, j);
      if constexpr (kChannel) {
        if (x.warp == 0)
          finish_rows(s, p, x.t0 + kChunk, read_here(s.span).chunk_len(j + 1), x.hv,
                      read_here(s.span).slot0 + j + 1, static_cast<int>((j + 1) & 1));
      } else {
        if (x.warp == 0) finish_rows(s, p, x.t0 + kChunk, read_here(s.span).chunk_len(j + 1), x.hv);
      }
    }

    if constexpr (kChannel) {  // T = A (the gated T, causal already) -> t; P stays as it landed
      SideHere const x = side_here(s, j);
      wait_landed(s, kALanded, j);
      if (j == num_chunks - 1) {
        zero_rows_past_end<kSideThreads>(s.a, kChunk, x.len, x.tid);
        zero_rows_past_end<kSideThreads>(s.p, kChunk, x.len, x.tid);
      }
      fence_proxy_async_shared();
      named_barrier_sync(kSideGroup, kSideThreads);
      for (int w = x.tid; w < kChunk * kChunk / 2; w += kSideThreads) {
        int const core = w / 32;
        int const i = core / (kChunk / 8) * 8 + w % 32 / 4;
        int const jc = core % (kChunk / 8) * 8 + w % 4 * 2;
        *reinterpret_cast<uint32_t*>(s.t + 2 * w) =
            *reinterpret_cast<uint32_t const*>(s.a + swizzled_offset<kChunk>(i, jc));
      }
    } else {  // Q K^T on this warpgroup's columns, under T's gates
      SideHere const x = side_here(s, j);
      float qk[kGateCols / 2] = {};
      fence_accumulators(qk);
      wgmma_fence();
      warpgroup_mma_async<kGateCols, kHeadDim>(KMajorSwizzledTile<kChunk>{s.q},
                                               KMajorSwizzledTile<kChunk>{k_of(s, j)}, 0, x.n0, qk);
      wgmma_commit();
      wait_landed(s, kALanded, j);
      if (j == num_chunks - 1) zero_rows_past_end<kSideThreads>(s.a, kChunk, x.len, x.tid);
      fence_proxy_async_shared();
      named_barrier_sync(kSideGroup, kSideThreads);
      // T = Gamma o A -> t, in 4-byte words of the blocked tile (a warp: one core matrix)
      for (int w = x.tid; w < kChunk * kChunk / 2; w += kSideThreads) {
        int const core = w / 32;
        int const i = core / (kChunk / 8) * 8 + w % 32 / 4;
        int const jc = core % (kChunk / 8) * 8 + w % 4 * 2;
        float2 const gate = causal_gates(s.gcum, i, jc);
        float2 const aa = ld_pair(s.a, swizzled_offset<kChunk>(i, jc));
        st_pair(s.t, 2 * w, aa.x * gate.x, aa.y * gate.y);
      }
      wgmma_wait<0>();
      fence_accumulators(qk);
      // P = causal(s (Q K^T) o Gamma) -> p
      for_each_blocked_pair<kChunk, kGateCols>(
          0, x.n0, qk, [&](int i, int jc, int at, float& c0, float& c1) {
            float2 const gate = causal_gates(s.gcum, i, jc);
            st_pair(s.p, at, scale * c0 * gate.x, scale * c1 * gate.y);
          });
    }
    fence_proxy_async_shared();
    named_barrier_arrive(kGatesFull, kThreads);

    if constexpr (kDsWalk) {  // the next chunk's tiles, once the column roles' Z has read dDelta
      named_barrier_sync(kChainFull, kThreads);  // (and every other tile's last reader is done)
      if (j > 0) {
        SideHere const y = side_here(s, j - 1);
        int const hk = kChannel ? y.hv : y.hv / p.problem.group_size();
        load_dout<kCols>(s, kp, y.t0, y.hv, col0, y.tid);
        load_q_h<false>(s, kp, y.t0, read_here(s.span).slot0 + j - 1, hk, y.hv, y.tid);
        load_k(s, k_of(s, j - 1), kp, y.t0, hk, y.tid);
        load_v_g_beta<false>(s, kp, y.t0, kChunk, y.hv, j - 1, y.tid);
        load_a(s, kp, y.t0, y.hv, y.tid);
      }
      continue;
    }

    // dP = mask(dO Delta^T): gate sums of P o dP, dQK = s Gamma o dP -> p
    named_barrier_sync(kDeltaFull, kThreads);
    {
      SideHere const x = side_here(s, j);
      float dp[kGateCols / 2] = {};
      warpgroup_mma<kGateCols, kHeadDim>(KMajorSwizzledTile<kChunk>{s.dout},
                                         KMajorTile<kHeadDim>{s.delta}, 0, x.n0, dp);
      named_barrier_sync(kPFree, kThreads);
      if constexpr (kChannel) {  // s mask(dP) -> p.dqk (fp32 rows of the chunk)
        for_each_wgmma_pair<kGateCols>(0, x.n0, dp, [&](int i, int jc, float& x0, float& x1) {
          x0 = i >= jc ? scale * x0 : 0.f;
          x1 = i >= jc + 1 ? scale * x1 : 0.f;
        });
        float* const out =
            p.dqk + ((x.t0 + x.row_lo) * HV + x.hv) * kChunk + x.n0 + 2 * (x.lane % 4);
        store_wgmma_rows<kGateCols>(out, int64_t{HV} * kChunk, x.row_lo, x.len, dp,
                                    [](float x0, float x1, bool) { return make_float2(x0, x1); });
      } else {
        gate_grad(dp, s.p, scale, s.gcum, s.gate_row_p, s.gate_col_p, x.n0, x.ow);
      }
    }
    fence_proxy_async_shared();
    named_barrier_sync(kSideGroup, kSideThreads);  // dQK complete (and T, from every thread)

    if constexpr (kChannel) {  // dqg = s dO h^T -> p.dqg
      SideHere const x = side_here(s, j);
      float dq[kStateHalf / 2] = {};
      warpgroup_mma<kStateHalf, kHeadDim>(KMajorSwizzledTile<kChunk>{s.dout},
                                          KMajorSwizzledTile<kHeadDim>{s.h}, 0, x.k0, dq);
      for (float& v : dq) v *= scale;
      store_rows(p.dqg, x, dq);
    }
    if constexpr (kChannel) {  // dkbar = Delta dS^T -> p.dkbar (Delta and bf16(dS) are whole)
      SideHere const x = side_here(s, j);
      float dkbar[kStateHalf / 2] = {};
      warpgroup_mma<kStateHalf, kHeadDim>(KMajorTile<kHeadDim>{s.delta}, KMajorTile<kHeadDim>{s.ds},
                                          0, x.k0, dkbar);
      store_rows(p.dkbar, x, dkbar);
    } else {  // dq = s e (dO h^T) + dQK K; <Q, dO h^T> by rows
      SideHere const x = side_here(s, j);
      float dq[kStateHalf / 2] = {};
      warpgroup_mma<kStateHalf, kHeadDim>(KMajorSwizzledTile<kChunk>{s.dout},
                                          KMajorSwizzledTile<kHeadDim>{s.h}, 0, x.k0, dq);
      store_tile_row_dots(dq, s.q, x.k0, s.oqh, x.ow, x.row_lo);
      fence_proxy_async_shared();  // Q read by ldmatrix, before the next chunk's TMA refills it
      float const se_lo = scale * __expf(s.gcum[x.row_lo]);
      float const se_hi = scale * __expf(s.gcum[x.row_lo + 8]);
      for_each_wgmma_pair<kStateHalf>(0, x.k0, dq, [&](int r, int, float& x0, float& x1) {
        float const se = r == x.row_lo ? se_lo : se_hi;
        x0 *= se;
        x1 *= se;
      });
      warpgroup_mma<kStateHalf, kChunk>(KMajorTile<kChunk>{s.p},
                                        MNMajorSwizzledTile<kChunk>{k_of(s, j)}, 0, x.k0, dq);
      reduce_rows(p.dq, kDqTurns, side_here(s, j), read_here(s.span).slot0 + j, dq);
    }

    named_barrier_sync(kChainFull, kThreads);
    {  // dk = Zs h^T + dQK^T Q + ebar (Delta dS^T) while the column roles form M, then
       // + M^T K + beta (dL K), beta (dL K) = M K
      // dO's last readers are done (both side warpgroups' dP and dq: ChainFull counts every side
      // thread; the column roles' P^T dO before PFree): the next chunk's dO
      SideHere const x = side_here(s, j);
      if (j > 0) load_dout<kHeadDim>(s, kp, x.t0 - kChunk, x.hv, 0, x.tid);
      bf16 const* const m = s.r;
      float dk[kStateHalf / 2];
      if constexpr (kChannel) {  // dkg = Zs h^T -> p.dkg
        {
          float dkg[kStateHalf / 2] = {};
          warpgroup_mma<kStateHalf, kHeadDim>(KMajorSwizzledTile<kChunk>{s.v},
                                              KMajorSwizzledTile<kHeadDim>{s.h}, 0, x.k0, dkg);
          store_rows(p.dkg, x, dkg);
        }

      } else {
        for (float& v : dk) v = 0.f;
        fence_accumulators(dk);
        wgmma_fence();
        warpgroup_mma_async<kStateHalf, kHeadDim>(KMajorSwizzledTile<kChunk>{s.v},
                                                  KMajorSwizzledTile<kHeadDim>{s.h}, 0, x.k0, dk);
        warpgroup_mma_async<kStateHalf, kChunk>(MNMajorTile<kChunk>{s.p},
                                                MNMajorSwizzledTile<kChunk>{s.q}, 0, x.k0, dk);
        warpgroup_mma_async<kStateHalf, kHeadDim>(KMajorTile<kHeadDim>{s.delta_eb},
                                                  KMajorTile<kHeadDim>{s.ds}, 0, x.k0, dk);
        wgmma_commit();
        wgmma_wait<0>();
        fence_accumulators(dk);
      }
      // ds's last reader is done: the column roles may store the next bf16(dS) once they are
      // through this step (they need nothing else from the side roles before TilesFull)
      named_barrier_arrive(kStepDone, kThreads);
      if constexpr (!kChannel) {  // E of this chunk runs under the next step's start: G is kept
        SideHere const y = side_here(s, j);
        if (y.warp == 0) {
          s.g_prev[y.lane] = s.gcum[y.lane];
          s.g_prev[y.lane + 32] = s.gcum[y.lane + 32];
        }
      }
      // Q's and h's last readers are done (the column roles' before ChainFull; both side
      // warpgroups' dq and these products, G's copy: the barrier): the next chunk's Q and h
      named_barrier_sync(kSideGroup, kSideThreads);
      if (j > 0) {
        SideHere const y = side_here(s, j - 1);
        load_q_h<true>(s, kp, y.t0, read_here(s.span).slot0 + j - 1,
                       kChannel ? y.hv : y.hv / p.problem.group_size(), y.hv, y.tid);
      }
      // dDelta's last reader (dT) is done: the next chunk's K into its tile; V's (Zs), G's and
      // beta's last readers are done (the column roles' K^T Zs and dT's gate sums, both side
      // warpgroups' Zs h^T): its V, G and beta
      named_barrier_sync(kDdeltaFree, kThreads);
      if (j > 0) {
        SideHere const y = side_here(s, j - 1);
        load_k(s, k_of(s, j - 1), kp, y.t0, kChannel ? y.hv : y.hv / p.problem.group_size(), y.tid);
        load_v_g_beta<true>(s, kp, y.t0, kChunk, y.hv, j - 1, y.tid);
      }
      named_barrier_sync(kMFull, kThreads);
      if constexpr (!kChannel) {
        wgmma_fence();
        int const k0 = side_here(s, j).k0;
        warpgroup_mma_async<kStateHalf, kChunk>(MNMajorTile<kChunk>{m},
                                                MNMajorSwizzledTile<kChunk>{k_of(s, j)}, 0, k0, dk);
        warpgroup_mma_async<kStateHalf, kChunk>(KMajorTile<kChunk>{m},
                                                MNMajorSwizzledTile<kChunk>{k_of(s, j)}, 0, k0, dk);
        wgmma_commit();
      }
      if (j > 0) {  // A's last readers are done (the column roles' Y and dL): the next chunk's A
        SideHere const y = side_here(s, j - 1);
        load_a(s, kp, y.t0, y.hv, y.tid);
      }
      if constexpr (!kChannel) {
        wgmma_wait<0>();
        fence_accumulators(dk);
        reduce_rows(p.dk, kDkTurns, side_here(s, j), read_here(s.span).slot0 + j, dk);
      }
    }
  }
  if (!kDsWalk && threadIdx.x % kSideThreads < 32 && num_chunks > 0) {  // warp 0
    if constexpr (kChannel)
      finish_rows(s, p, s.span.begin, s.span.chunk_len(0), s.walk.hv, s.span.slot0, 0);
    else
      finish_rows(s, p, s.span.begin, s.span.chunk_len(0), s.walk.hv);
  }
}

// The walk and the dS-walk: a 1-D grid of N x HV x kSlices CTAs (walk_slice_of_block), kSlices 1
// (a CTA per walk, all of dS's columns) or, for the dS-walk alone, kSlicesOfH (a CTA per 64 of
// dS's columns: the split dS-walk, launch.cu says when). The chunk pass: a 1-D grid of
// num_slots x HV CTAs, value heads fastest, each the walk of one chunk (its span: the chunk alone,
// slot0 its slot); the slots that hold no chunk exit at once.
template <class Decay, Form kForm, int kSlices>
__global__ void __launch_bounds__(kThreads, 1)
    walk_a_bwd_kernel(__grid_constant__ KernelParams const kp) {
  static_assert(kSlices == 1 || kForm == Form::kDsWalk,
                "only the dS-walk splits by dS's columns (the walk's and the chunk pass's other "
                "products reduce over V)");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage<Decay>*>(smem_raw);
  Params const& p = kp.p;
  // With the ordered dq/dk sum, CTAs by ticket (ptx.cuh): the CTA of a lower ticket, whose turn
  // this one may wait on, has started. Tickets follow the blocks' start order. The dS-walk writes
  // no dq or dk: it takes no ticket (and no turn).
  int64_t order = blockIdx.x;
  if (kForm != Form::kDsWalk && p.order != nullptr) {
    if (threadIdx.x == 0) s.ticket = take_ticket(p.order);
    __syncthreads();
    order = s.ticket;
  }
  WalkRef walk;
  WalkSpan span;
  int col0 = 0;  // the CTA's first column of dS
  if constexpr (kForm == Form::kChunkPass) {
    // value heads fastest: a q/k head's value heads of one slot hold adjacent tickets in
    // ascending order, and each waits only on the one before (a lower ticket)
    int64_t const slot = order / p.problem.num_v_heads;
    ChunkRef c;
    if (!find_chunk(p.problem, slot, c)) return;  // every value head of the slot: no turns
    walk.n = c.n;
    walk.hv = static_cast<int32_t>(order % p.problem.num_v_heads);
    span.begin = c.t0;
    span.seq_len = c.len;
    span.slot0 = slot;
  } else {
    WalkSlice const slice = walk_slice_of_block<kSlices>(p.problem, order);
    walk = slice.walk;
    col0 = slice.c0;
    span = walk_span(p.problem, walk);
  }
  if (threadIdx.x == 0) {
    s.walk = walk;
    s.span = span;
    for (uint64_t& bar : s.landed) mbarrier_init(&bar, 1);
    mbarrier_init_fence();
  }
  // this walk's h, from the h-walk running beside it (Params::h_ready); wait_flag ends in a
  // barrier, which also publishes s.walk and s.span
  // h then comes by TMA (the async proxy): the fence orders the flag's acquire before those reads
  // (the dS-walk reads no h: it waits on no flag)
  if (kForm != Form::kDsWalk && p.h_ready != nullptr) {
    wait_flag(p.h_ready + int64_t{walk.n} * p.problem.num_v_heads + walk.hv, kSlicesOfH);
    fence_proxy_async_global();
  } else {
    __syncthreads();
  }
  run_roles<kColumnRegs, kSideRegs>(
      [&](int wg) { column_role<Decay, kForm, kSlices>(s, p, wg, col0); },
      [&] { side_role<Decay, kForm, kSlices>(s, kp, col0); });
#endif
}

}  // namespace cake::kernels::walk_a_bwd
