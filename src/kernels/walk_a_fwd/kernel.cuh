// The forward walk (F5 and F6 of fla_reference.md §2.2; step 2 of
// docs/design/gdn-hopper-v8-plan.md): one CTA per (document, value head), walking the document's
// chunks in order with the whole [128 x 128] fp32 state h (the chunk's start state) in registers,
// Delta rebuilt from kkt_solve's A = (I + diag(beta) L)^-1. With Gamma_ij = e^{G_i - G_j},
// T = Gamma o A, so
//   Delta = U - W h = T diag(beta) (V - e^G (K h)) = (Gamma o A) (diag(beta) (V - e^G (K h))).
// Per chunk:
//   Q h, K h                                 [64 x 128] each (h's fragments read once for both)
//   R     = beta_i (V - e^{G_i} (K h)_i)     [64 x 128] bf16
//   Ag    = causal(A_ij e^{G_i - G_j})       [64 x 64] bf16 (i >= j)
//   P     = causal(scale (Q K^T)_ij e^{G_i - G_j})  (shares Ag's exponentials)
//   Delta = Ag R                              [64 x 128]
//   O     = scale e^G (Q h) + P Delta         -> o (bf16)
//   h     = e^{G_last} h + (K e^{G_last - G})^T Delta
// Against a walk on the WY form's W and U (state_output_fwd until v8): one more [64 x 64 x 128]
// product per chunk and one more barrier, but V and A (8 KB) in place of W and U (32 KB) per
// chunk, and kkt_solve instead of the WY stage before it. It runs saved mode's forward (o, the
// final state and bf16 h per chunk, the backward's) and the backward's h-walk (o == nullptr: h and
// no o; no Q h, P or P Delta), bitwise the same h (the same products in the same order).
// Recompute mode's forward (o without h) runs roles.cuh's walk, which does this walk's arithmetic
// in the same order on warpgroup roles (faster there, slower where h is stored: roles.cuh).
// 16 warps: each owns a [16 x 64] block of the state (32 registers per thread) and a [16 x 32]
// tile of O, R and Delta.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/common/walk.cuh"
#include "kernels/walk_a_fwd/params.hpp"

namespace cake::kernels::walk_a_fwd {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kStateCols = 64;  // state columns per warp: 8 row blocks x 2 column halves
inline constexpr int kLdA =
    kChunk + 8;  // bf16 [64 x 64] tiles: 144-byte rows, ldmatrix conflict-free
// O's and Delta's warp tiles: [16 x 32] (1 x 4 mma tiles of 16 x 8), 16 of them, one per warp.
inline constexpr int kOutNi = 4;

// One chunk's operands; two of them alternate (the next chunk loads while this one computes).
struct ChunkTiles {
  __nv_bfloat16 q[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 v[kChunk * kLdBf16];  // [64 x 128] V; then bf16(e^{G_last - G} Delta)
  __nv_bfloat16 a[kChunk * kLdA];     // [64 x 64]  A (zero past the end)
  float gcum[kChunk];                 // G; rows past the end repeat G of the last token
  float beta[kChunk];                 // beta; 0 past the end
};

// About 207 KB: one CTA per SM.
struct SharedStorage {
  ChunkTiles tiles[2];
  __nv_bfloat16 hb[kHeadDim * kLdBf16];   // [128 x 128] bf16(h), operand of K h and Q h
  __nv_bfloat16 r[kChunk * kLdBf16];      // [64 x 128]  bf16(R), operand of Ag R
  __nv_bfloat16 delta[kChunk * kLdBf16];  // [64 x 128]  bf16(Delta), operand of P Delta
  __nv_bfloat16 ag[kChunk * kLdA];        // [64 x 64]   bf16(Ag)
  __nv_bfloat16 p[kChunk * kLdA];         // [64 x 64]   bf16(P)
};
static_assert(kWarps * 16 * kStateCols == kHeadDim * kHeadDim, "the warps tile the state");
static_assert(kWarps * 16 * 8 * kOutNi == kChunk * kHeadDim, "the warps tile O and Delta");
static_assert(sizeof(SharedStorage) <= 227 * 1024, "walk_a_fwd shared memory exceeds 227 KB");

__device__ __forceinline__ void load_chunk(ChunkTiles& t, Params const& p, int64_t t0, int len,
                                           int h, int hv) {
  load_walk_inputs_async<kThreads>(WalkTiles{t.q, t.k, t.v, t.a, kLdA, t.gcum, t.beta}, p, t0,
                                   len, h, hv);
  cp_async_commit();
}

// kWithO: o (saved mode's forward) or not (the backward's h-walk); h per chunk either way. A
// template parameter, not a branch: a branch kept both paths' registers live and spilled the
// forward (88 bytes of stack for o, 4 for h).
template <bool kWithO>
__global__ void __launch_bounds__(kThreads, 1) walk_a_fwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  // Every block of the h-walk is resident once it gets here, so the reverse walk's blocks, which
  // wait on these blocks' flags, can take the SMs this grid leaves idle without a deadlock.
  if (!kWithO && p.walk_done != nullptr) launch_dependents();
  WalkRef const walk = walk_of_block(p.problem, blockIdx.x);
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
  // This warp's tile of O, R and Delta: rows o_m0 .. o_m0 + 15, columns o_n0 .. o_n0 + 31; the
  // thread's rows o_row and o_row + 8.
  int const o_m0 = 16 * (warp / (kHeadDim / (8 * kOutNi)));
  int const o_n0 = 8 * kOutNi * (warp % (kHeadDim / (8 * kOutNi)));
  int const o_row = o_m0 + (tid % 32) / 4;

  int64_t const num_chunks = span.num_chunks();
  if (num_chunks > 0) load_chunk(s.tiles[0], p, span.begin, span.chunk_len(0), h, hv);
  for (int64_t j = 0; j < num_chunks; ++j) {
    ChunkTiles& t = s.tiles[j % 2];
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);

    // h (the chunk's start state) -> bf16 operand. hb's last readers (K h, Q h of chunk j - 1)
    // finished before that chunk's second barrier.
    store_acc_bf16<1, kStateCols / 8>(row0, col0, state, s.hb, kLdBf16);
    cp_async_wait<0>();
    __syncthreads();  // B1: chunk j's tiles and bf16(h) visible; chunk j - 1's tiles, r, ag, p,
                      // delta free
    if (j + 1 < num_chunks)
      load_chunk(s.tiles[(j + 1) % 2], p, t0 + kChunk, span.chunk_len(j + 1), h, hv);
    float const g_last = t.gcum[len - 1];

    // Q h and K h on this warp's tile, with h's fragments read once for both (K h alone in the
    // h-walk)
    float o_acc[1][kOutNi][4] = {};
    float kh[1][kOutNi][4] = {};
    if constexpr (kWithO)
      warp_tile_mma_shared_b<kHeadDim, 1, kOutNi>(RowMajor{t.q, kLdBf16}, RowMajor{t.k, kLdBf16},
                                                  RowMajor{s.hb, kLdBf16}, o_m0, o_n0, o_acc, kh);
    else
      warp_tile_mma<kHeadDim, 1, kOutNi>(RowMajor{t.k, kLdBf16}, RowMajor{s.hb, kLdBf16}, o_m0,
                                         o_n0, kh);
    // The thread's two rows' exponentials once per chunk (the pair loops store to shared memory,
    // so the compiler would reload G per pair)
    float const g_lo = t.gcum[o_row];
    float const g_hi = t.gcum[o_row + 8];
    float const eg_lo = __expf(g_lo);
    float const eg_hi = __expf(g_hi);
    // O's first term scale e^{G_i} (Q h)_i (the row scale on the fp32 product, as FLA does)
    for_each_acc_pair<1, kOutNi>(o_m0, o_n0, o_acc, [&](int i, int, float& c0, float& c1) {
      float const q_scale = scale * (i % 16 < 8 ? eg_lo : eg_hi);  // o_m0 is a multiple of 16
      c0 *= q_scale;
      c1 *= q_scale;
    });
    // R = beta_i (V - e^{G_i} (K h)_i) -> r (rows past the end: beta is zero there, so R is).
    // beta on R's rows rather than on Ag's columns: one rounding of beta V where Ag is I (strong
    // decay makes Ag diagonal; bf16(beta) V rounded again was 1.12x FLA's final-state error at
    // g = -20)
    float const beta_lo = t.beta[o_row];
    float const beta_hi = t.beta[o_row + 8];
    for_each_acc_pair<1, kOutNi>(o_m0, o_n0, kh, [&](int i, int col, float& c0, float& c1) {
      float const eg = i % 16 < 8 ? eg_lo : eg_hi;
      float const b = i % 16 < 8 ? beta_lo : beta_hi;
      float2 const v =
          __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(t.v + i * kLdBf16 + col));
      *reinterpret_cast<__nv_bfloat162*>(s.r + i * kLdBf16 + col) =
          __floats2bfloat162_rn(b * (v.x - eg * c0), b * (v.y - eg * c1));
    });
    // P = causal(scale (Q K^T) e^{G_i - G_j}) and Ag = causal(A e^{G_i - G_j}), one exponential
    // per element for both (Ag alone in the h-walk)
    if constexpr (!kWithO) {
      for (int idx = tid; idx < kChunk * kChunk / 2; idx += kThreads) {
        int const i = idx / (kChunk / 2);
        int const jc = idx % (kChunk / 2) * 2;
        float2 const gate = causal_gates(t.gcum, i, jc);
        float const e0 = gate.x;
        float const e1 = gate.y;
        float2 const a =
            __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(t.a + i * kLdA + jc));
        *reinterpret_cast<__nv_bfloat162*>(s.ag + i * kLdA + jc) =
            __floats2bfloat162_rn(a.x * e0, a.y * e1);
      }
    } else {
      block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
          RowMajor{t.q, kLdBf16}, ColMajor{t.k, kLdBf16}, [&](int i, int jc, float c0, float c1) {
            float2 const gate = causal_gates(t.gcum, i, jc);
            float const e0 = gate.x;
            float const e1 = gate.y;
            *reinterpret_cast<__nv_bfloat162*>(s.p + i * kLdA + jc) =
                __floats2bfloat162_rn(scale * c0 * e0, scale * c1 * e1);
            float2 const a =
                __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(t.a + i * kLdA + jc));
            *reinterpret_cast<__nv_bfloat162*>(s.ag + i * kLdA + jc) =
                __floats2bfloat162_rn(a.x * e0, a.y * e1);
          });
    }
    __syncthreads();  // B2: r, p, ag complete

    // Delta = Ag R on this warp's tile; delta <- bf16(Delta), t.v <- bf16(e^{G_last - G} Delta)
    // (V's elements were read above by the thread that now overwrites them)
    {
      float d_acc[1][kOutNi][4] = {};
      warp_tile_mma<kChunk, 1, kOutNi>(RowMajor{s.ag, kLdA}, RowMajor{s.r, kLdBf16}, o_m0, o_n0,
                                       d_acc);
      float const decay_lo = o_row < len ? __expf(g_last - g_lo) : 0.f;
      float const decay_hi = o_row + 8 < len ? __expf(g_last - g_hi) : 0.f;
      for_each_acc_pair<1, kOutNi>(o_m0, o_n0, d_acc, [&](int i, int col, float& c0, float& c1) {
        float const decay = i % 16 < 8 ? decay_lo : decay_hi;
        *reinterpret_cast<__nv_bfloat162*>(s.delta + i * kLdBf16 + col) =
            __floats2bfloat162_rn(c0, c1);
        *reinterpret_cast<__nv_bfloat162*>(t.v + i * kLdBf16 + col) =
            __floats2bfloat162_rn(decay * c0, decay * c1);
      });
    }
    // bf16(h) -> h[slot] in 16-byte vectors (hb is next written after B3, which every thread
    // passes after this copy)
    {
      __nv_bfloat16* const h_out = p.h + ((span.slot0 + j) * HV + hv) * kHeadDim * kHeadDim;
      for (int idx = tid; idx < kHeadDim * kHeadDim / 8; idx += kThreads) {
        int const r = idx / (kHeadDim / 8);
        int const c = (idx % (kHeadDim / 8)) * 8;
        *reinterpret_cast<uint4*>(h_out + r * kHeadDim + c) =
            *reinterpret_cast<uint4 const*>(s.hb + r * kLdBf16 + c);
      }
    }
    __syncthreads();  // B3: Delta and decayed Delta complete

    // O += P Delta -> o
    if constexpr (kWithO) {
      warp_tile_mma<kChunk, 1, kOutNi>(RowMajor{s.p, kLdA}, RowMajor{s.delta, kLdBf16}, o_m0, o_n0,
                                       o_acc);
      __nv_bfloat16* const o = p.o + (t0 * HV + hv) * kHeadDim;
      for_each_acc_pair<1, kOutNi>(o_m0, o_n0, o_acc, [&](int i, int col, float& c0, float& c1) {
        if (i < len)
          *reinterpret_cast<__nv_bfloat162*>(o + i * v_stride + col) =
              __floats2bfloat162_rn(c0, c1);
      });
    }

    // h = e^{G_last} h + (K e^{G_last - G})^T Delta, in registers
    float const gamma = __expf(g_last);
    for_each_acc_pair<1, kStateCols / 8>(row0, col0, state, [&](int, int, float& c0, float& c1) {
      c0 *= gamma;
      c1 *= gamma;
    });
    warp_tile_mma<kChunk, 1, kStateCols / 8>(ColMajor{t.k, kLdBf16}, RowMajor{t.v, kLdBf16}, row0,
                                             col0, state);
  }

  if (p.ht != nullptr) store_state_rows<kStateCols>(state, row0, p.ht, state_offset + col0);
  if (!kWithO && p.walk_done != nullptr) signal_flag(p.walk_done + int64_t{walk.n} * HV + hv);
#endif
}

}  // namespace cake::kernels::walk_a_fwd
