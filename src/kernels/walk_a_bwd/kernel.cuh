// The fused reverse walk (step 4 of docs/design/gdn-hopper-v8-plan.md): one CTA per (document,
// value head), walking the document's chunks last to first with dS (the gradient of the chunk's
// end state, [128 x 128] fp32) in registers, and forming every gradient of a chunk on chip from
// its inputs, A (kkt_solve), G, beta and its start state h (the h-walk, walk_a_fwd with
// o == nullptr). It replaced (v9) the staged backward (a recompute of W, U, T, h and Delta, then
// four kernels with dDelta, dS and dW in HBM between them); nothing per chunk
// but the gradients reaches HBM. The maths, product by product in this order, is the FP64 model
// tests/cpp/reverse_walk_model.hpp (held to the reference by test_reverse_walk_model.cpp).
//
// Per chunk (e = e^G, ebar = e^{G_last - G}, gamma = e^{G_last}, Gamma_ij = e^{G_i - G_j} for
// i >= j; rows past the chunk's end are zero in every tile, so every product sees zeros there):
//   A:  K h;  Rt = V - e (K h) (fp32, registers);  R = beta Rt (-> r);  K dS;
//       <dS, h>;  T = Gamma o A (-> t);  P = causal(s Q K^T o Gamma) (-> p)
//   B:  Delta = T R (-> delta);  <K dS, Delta> by rows;  dDelta = ebar (K dS) + P^T dO (-> ddelta)
//   C1: Z = T^T dDelta, its diagonal term from fp32 dDelta;  <Z, Rt> by rows (fp32 Rt);
//       dv = beta Z;  Zs = -beta e Z (-> v)
//   C2: dT = mask(dDelta R^T): gate sums of T o dT, dA = Gamma o dT (-> t, in place);
//       dP = mask(dO Delta^T): gate sums of P o dP, dQK = s Gamma o dP (-> p, in place)
//   D1: eO = s e dO (-> ddelta);  Y = A^T dA (-> r);  dq = s e (dO h^T) + dQK K;
//       <Q, dO h^T> by rows (= <dO, Q h>, so Q h is never formed)
//   D2: dS <- gamma dS + Q^T eO + K^T Zs (registers; with an initial state, eO as bf16 hi + lo
//       parts, lo -> dout);  dL = -strict(Y A^T) (-> t), M = beta dL
//   D3: dk = Zs h^T + dQK^T Q + M^T K + ebar (Delta dS^T) + beta (dL K);  <dL K, K> and
//       <Zs h^T, K> = -beta e <Z, K h> by rows (so that K h need not live past A)
//   E:  (warp 0) dbeta = <Z, Rt> + <dL K, K>;  dG from the row sums (the terms that cancel
//       exactly left out, as in the model); dg = reverse cumsum of dG. It runs while the next
//       chunk's tiles load (the row sums live until that chunk's first barrier; G is copied).
// dq and dk are this value head's terms, fp32 [BT, HV, K]: a reduction over the value heads of
// a q/k head follows (and the L2-norm backward).
//
// First version: mma.sync warp products, 16 warps, eight barriers per chunk, tiles loaded at the
// start of each chunk (no prefetch: shared memory holds one chunk's tiles and intermediates,
// ~222 KB). Each warp owns a [16 x 64] block of dS, a [16 x 32] tile of the [64 x 128] products
// and a [16 x 16] tile of the [64 x 64] ones. Row and column sums go through one slot per warp
// part and are added in ascending slot order (bitwise deterministic, no atomics).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/common/walk.cuh"
#include "kernels/walk_a_bwd/params.hpp"

namespace cake::kernels::walk_a_bwd {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kStateCols = 64;    // dS columns per warp: 8 row blocks x 2 column halves
inline constexpr int kLdC = kChunk + 8;  // bf16 [64 x 64] tiles: 144-byte rows
inline constexpr int kOutNi = 4;         // [64 x 128] warp tiles: [16 x 32]
inline constexpr int kParts = 4;         // column parts of a [64 x 128] or [64 x 64] row sum

struct SharedStorage {
  __nv_bfloat16 q[kChunk * kLdBf16];       // [64 x 128]
  __nv_bfloat16 k[kChunk * kLdBf16];       // [64 x 128]
  __nv_bfloat16 v[kChunk * kLdBf16];       // [64 x 128] V; then Zs = -beta e Z
  __nv_bfloat16 dout[kChunk * kLdBf16];    // [64 x 128]
  __nv_bfloat16 h[kHeadDim * kLdBf16];     // [128 x 128] the chunk's start state
  __nv_bfloat16 ds[kHeadDim * kLdBf16];    // [128 x 128] bf16(dS) of the chunk's end state
  __nv_bfloat16 a[kChunk * kLdC];          // [64 x 64] A
  __nv_bfloat16 t[kChunk * kLdC];          // [64 x 64] T; dA; then dL
  __nv_bfloat16 p[kChunk * kLdC];          // [64 x 64] P; then dQK
  __nv_bfloat16 r[kChunk * kLdBf16];       // [64 x 128] R; then Y [64 x 72] and M [64 x 64]
  __nv_bfloat16 delta[kChunk * kLdBf16];   // [64 x 128] Delta
  __nv_bfloat16 ddelta[kChunk * kLdBf16];  // [64 x 128] dDelta; then eO = s e dO
  float gcum[kChunk];                      // G; rows past the end repeat G of the last token
  float g_prev[kChunk];                    // the previous chunk's G, for its E
  float beta[kChunk];                      // beta; 0 past the end
  float oqh[kParts * kChunk];              // row sums <Q, dO h^T> = <dO, Q h>
  float zkh[kParts * kChunk];              // <Zs h^T, K> = -beta e <Z, K h>
  float zrt[kParts * kChunk];              // <Z, Rt>
  float kdsd[kParts * kChunk];             // <K dS, Delta>
  float dlk[kParts * kChunk];              // <dL K, K>
  float gate_row[kParts * kChunk];         // row sums of T o dT + P o dP (i > j)
  float gate_col[kParts * kChunk];         // column sums of the same
  float dsh[kWarps];                       // <dS, h> per warp
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "walk_a_bwd shared memory exceeds 227 KB");
static_assert(kChunk * kLdC + kChunk * kChunk <= kChunk * kLdBf16, "Y and M fit in r");
static_assert(kWarps * 16 * kStateCols == kHeadDim * kHeadDim, "the warps tile dS");
static_assert(kWarps * 16 * 8 * kOutNi == kChunk * kHeadDim, "the warps tile [64 x 128]");
static_assert(kWarps * 16 * 16 == kChunk * kChunk, "the warps tile [64 x 64]");

using Tile = float[1][kOutNi][4];  // a warp's [16 x 32] accumulator tile
using Tile64 = float[1][2][4];     // a warp's [16 x 16] accumulator tile

__device__ __forceinline__ float2 ld2(__nv_bfloat16 const* base, int ld, int i, int c) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(base + i * ld + c));
}
__device__ __forceinline__ void st2(__nv_bfloat16* base, int ld, int i, int c, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(base + i * ld + c) = __floats2bfloat162_rn(x, y);
}

// parts[part][row] <- the sum over a [16 x 32] (or [16 x 16]) warp tile's columns of the thread
// sums lo (row m0 + lane / 4) and hi (row + 8): the quad's four threads hold a row's columns.
__device__ __forceinline__ void store_row_parts(float lo, float hi, float* parts, int part,
                                                int m0) {
  lo += __shfl_xor_sync(0xffffffffu, lo, 1);
  lo += __shfl_xor_sync(0xffffffffu, lo, 2);
  hi += __shfl_xor_sync(0xffffffffu, hi, 1);
  hi += __shfl_xor_sync(0xffffffffu, hi, 2);
  int const lane = threadIdx.x % 32;
  if (lane % 4 == 0) {
    parts[part * kChunk + m0 + lane / 4] = lo;
    parts[part * kChunk + m0 + lane / 4 + 8] = hi;
  }
}

// The thread's row sums of x o y over a [16 x 32] tile held in registers by both.
__device__ __forceinline__ void dot_rows(Tile const& x, Tile const& y, float& lo, float& hi) {
  lo = 0.f;
  hi = 0.f;
#pragma unroll
  for (int ni = 0; ni < kOutNi; ++ni) {
    lo += x[0][ni][0] * y[0][ni][0] + x[0][ni][1] * y[0][ni][1];
    hi += x[0][ni][2] * y[0][ni][2] + x[0][ni][3] * y[0][ni][3];
  }
}

// The thread's row sums of x o Y over a [16 x 32] tile, Y a bf16 shared tile.
__device__ __forceinline__ void dot_rows(Tile& x, __nv_bfloat16 const* y, int ld, int m0, int n0,
                                         float& lo, float& hi) {
  lo = 0.f;
  hi = 0.f;
  for_each_acc_pair<1, kOutNi>(m0, n0, x, [&](int i, int c, float& c0, float& c1) {
    float2 const o = ld2(y, ld, i, c);
    (i % 16 < 8 ? lo : hi) += c0 * o.x + c1 * o.y;
  });
}

// Row and column sums of g over a warp's [16 x 16] tile at (m0, n0) into gate_row[n0 / 16][i]
// and gate_col[m0 / 16][j]; `first` stores, else adds (the same thread owns a slot in both
// passes, so the read-modify-write needs no barrier). g(i, j, c) gives the element of value c.
template <class G>
__device__ __forceinline__ void gate_sums(Tile64& acc, int m0, int n0, float* gate_row,
                                          float* gate_col, bool first, G const& g) {
  int const lane = threadIdx.x % 32;
  float lo = 0.f, hi = 0.f;
  float col[2][2] = {};
#pragma unroll
  for (int ni = 0; ni < 2; ++ni)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int const i = m0 + lane / 4 + 8 * half;
      int const j = n0 + 8 * ni + 2 * (lane % 4);
      float const g0 = g(i, j, acc[0][ni][2 * half]);
      float const g1 = g(i, j + 1, acc[0][ni][2 * half + 1]);
      (half == 0 ? lo : hi) += g0 + g1;
      col[ni][0] += g0;
      col[ni][1] += g1;
    }
  lo += __shfl_xor_sync(0xffffffffu, lo, 1);
  lo += __shfl_xor_sync(0xffffffffu, lo, 2);
  hi += __shfl_xor_sync(0xffffffffu, hi, 1);
  hi += __shfl_xor_sync(0xffffffffu, hi, 2);
#pragma unroll
  for (int ni = 0; ni < 2; ++ni)
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
      for (int d = 4; d < 32; d *= 2) col[ni][x] += __shfl_xor_sync(0xffffffffu, col[ni][x], d);
  float* const rows = gate_row + (n0 / 16) * kChunk;
  float* const cols = gate_col + (m0 / 16) * kChunk;
  if (lane % 4 == 0) {
    int const i = m0 + lane / 4;
    rows[i] = first ? lo : rows[i] + lo;
    rows[i + 8] = first ? hi : rows[i + 8] + hi;
  }
  if (lane < 4) {
#pragma unroll
    for (int ni = 0; ni < 2; ++ni)
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        int const j = n0 + 8 * ni + 2 * lane + x;
        cols[j] = first ? col[ni][x] : cols[j] + col[ni][x];
      }
  }
}

// One of C2's two [64 x 64] gradients on this warp's tile: dX = mask(A B) (i >= j), the gate sums
// of X o dX (i > j; `first` stores them, else adds), then factor Gamma o dX -> x in place (each
// thread overwrites only the elements of X it has read). X is T (dA) or P (dQK).
template <class A, class B>
__device__ __forceinline__ void masked_gate_grad(A const& a, B const& b, __nv_bfloat16* x,
                                                 float factor, bool first, SharedStorage& s,
                                                 int m0, int n0) {
  Tile64 dx = {};
  warp_tile_mma<kHeadDim, 1, 2>(a, b, m0, n0, dx);
  gate_sums(dx, m0, n0, s.gate_row, s.gate_col, first, [&](int i, int jc, float& c) {
    float const d = i >= jc ? c : 0.f;
    float const xx = __bfloat162float(x[i * kLdC + jc]);
    c = d;
    return i > jc ? xx * d : 0.f;
  });
  for_each_acc_pair<1, 2>(m0, n0, dx, [&](int i, int jc, float& c0, float& c1) {
    float2 const gate = causal_gates(s.gcum, i, jc);
    st2(x, kLdC, i, jc, factor * gate.x * c0, factor * gate.y * c1);
  });
}

__device__ __forceinline__ void load_chunk(SharedStorage& s, Params const& p, int64_t t0, int len,
                                           int64_t slot, int h, int hv) {
  int const HV = p.problem.num_v_heads;
  load_walk_inputs_async<kThreads>(WalkTiles{s.q, s.k, s.v, s.a, kLdC, s.gcum, s.beta}, p, t0,
                                   len, h, hv);
  load_tile_async<kChunk, kHeadDim, kThreads>(s.dout, kLdBf16, p.dout + (t0 * HV + hv) * kHeadDim,
                                              int64_t{HV} * kHeadDim, len);
  load_tile_async<kHeadDim, kHeadDim, kThreads>(
      s.h, kLdBf16, p.h + (slot * HV + hv) * kHeadDim * kHeadDim, kHeadDim, kHeadDim);
  cp_async_commit();
}

// E (warp 0; lane l: rows l and l + 32) of the chunk at t0 of len tokens: dbeta, dG and its
// reverse cumsum dg from its row sums and G (g_prev), which stay in shared memory until the next
// chunk's B1.
__device__ __forceinline__ void finish_rows(SharedStorage const& s, Params const& p, int64_t t0,
                                            int len, int hv) {
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
    float const kd = sum_parts<kChunk, kParts>(s.kdsd, i);
    float const t_i = i < len - 1 ? __expf(g_last - gi) * kd : 0.f;
    dbeta_row[half] = sum_parts<kChunk, kParts>(s.zrt, i) + sum_parts<kChunk, kParts>(s.dlk, i);
    dg_row[half] = e * scale * sum_parts<kChunk, kParts>(s.oqh, i) +
                   sum_parts<kChunk, kParts>(s.zkh, i) +
                   sum_parts<kChunk, kParts>(s.gate_row, i) -
                   sum_parts<kChunk, kParts>(s.gate_col, i) - t_i;
    tail += t_i;
  }
  for (int d = 16; d > 0; d /= 2) tail += __shfl_xor_sync(0xffffffffu, tail, d);
  float const dsh = sum_parts<1, kWarps>(s.dsh, 0);
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
        static_cast<__nv_bfloat16*>(p.dbeta)[row] = __float2bfloat16(dbeta_row[half]);
      else
        static_cast<float*>(p.dbeta)[row] = dbeta_row[half];
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) walk_a_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  WalkRef const walk = walk_of_block(p.problem, blockIdx.x);
  int const hv = walk.hv;
  int const HV = p.problem.num_v_heads;
  int const hk = hv / p.problem.group_size();
  int const tid = threadIdx.x;
  int const warp = tid / 32;
  int const lane = tid % 32;
  float const scale = p.problem.scale;
  WalkSpan const span = walk_span(p.problem, walk);
  int64_t const state_offset = (int64_t{walk.n} * HV + hv) * kHeadDim * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  // This warp's block of dS: rows row0 .. row0 + 15, columns col0 .. col0 + 63.
  int const row0 = 16 * (warp % (kHeadDim / 16));
  int const col0 = kStateCols * (warp / (kHeadDim / 16));
  StateRows<kStateCols> ds;
  load_state_rows<kStateCols>(ds, row0, p.dht, state_offset + col0);
  // This warp's [16 x 32] tile of the [64 x 128] products (the thread's rows o_row, o_row + 8)
  // and [16 x 16] tile of the [64 x 64] ones.
  int const o_m0 = 16 * (warp / (kHeadDim / (8 * kOutNi)));
  int const o_n0 = 8 * kOutNi * (warp % (kHeadDim / (8 * kOutNi)));
  int const o_part = warp % (kHeadDim / (8 * kOutNi));
  int const o_row = o_m0 + lane / 4;
  int const c_m0 = 16 * (warp / 4);
  int const c_n0 = 16 * (warp % 4);
  __nv_bfloat16* const m = s.r + kChunk * kLdC;  // M, [64 x 64] with rows of 64

  int64_t const num_chunks = span.num_chunks();
  for (int64_t j = num_chunks - 1; j >= 0; --j) {
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);
    // (the previous chunk's B8: its readers of every tile are done)
    load_chunk(s, p, t0, len, span.slot0 + j, hk, hv);
    if (warp == 0 && j + 1 < num_chunks)  // E of the previous chunk, under the loads
      finish_rows(s, p, t0 + kChunk, span.chunk_len(j + 1), hv);
    store_acc_bf16<1, kStateCols / 8>(row0, col0, ds, s.ds, kLdBf16);
    cp_async_wait<0>();
    __syncthreads();  // B1: the chunk's tiles and bf16(dS) visible

    // ---- A
    float const g_last = s.gcum[len - 1];
    float const gamma = __expf(g_last);
    float const g_lo = s.gcum[o_row];
    float const g_hi = s.gcum[o_row + 8];
    float const e_lo = __expf(g_lo);
    float const e_hi = __expf(g_hi);
    float const eb_lo = __expf(g_last - g_lo);
    float const eb_hi = __expf(g_last - g_hi);
    float const b_lo = s.beta[o_row];
    float const b_hi = s.beta[o_row + 8];
    auto const by_row = [](int i, float lo, float hi) { return i % 16 < 8 ? lo : hi; };

    // K h, then Rt = V - e (K h) in place: fp32 in registers until <Z, Rt> (C1), which a bf16
    // copy would make ~1.2x less accurate; R = beta Rt -> r
    Tile rt = {};
    warp_tile_mma<kHeadDim, 1, kOutNi>(RowMajor{s.k, kLdBf16}, RowMajor{s.h, kLdBf16}, o_m0, o_n0,
                                       rt);
    for_each_acc_pair<1, kOutNi>(o_m0, o_n0, rt, [&](int i, int c, float& c0, float& c1) {
      float2 const vv = ld2(s.v, kLdBf16, i, c);
      float const e = by_row(i, e_lo, e_hi);
      float const b = by_row(i, b_lo, b_hi);
      c0 = vv.x - e * c0;
      c1 = vv.y - e * c1;
      st2(s.r, kLdBf16, i, c, b * c0, b * c1);
    });
    Tile kds = {};  // K dS; then dDelta
    warp_tile_mma<kHeadDim, 1, kOutNi>(RowMajor{s.k, kLdBf16}, RowMajor{s.ds, kLdBf16}, o_m0, o_n0,
                                       kds);
    {  // <dS, h> over this warp's block of dS
      float acc = 0.f;
      for_each_acc_pair<1, kStateCols / 8>(row0, col0, ds, [&](int r, int c, float& c0, float& c1) {
        float2 const hh = ld2(s.h, kLdBf16, r, c);
        acc += c0 * hh.x + c1 * hh.y;
      });
      for (int d = 16; d > 0; d /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, d);
      if (lane == 0) s.dsh[warp] = acc;
    }
    // T = Gamma o A -> t
    for (int idx = tid; idx < kChunk * kChunk / 2; idx += kThreads) {
      int const i = idx / (kChunk / 2);
      int const jc = idx % (kChunk / 2) * 2;
      float2 const gate = causal_gates(s.gcum, i, jc);
      float const e0 = gate.x;
      float const e1 = gate.y;
      float2 const aa = ld2(s.a, kLdC, i, jc);
      st2(s.t, kLdC, i, jc, aa.x * e0, aa.y * e1);
    }
    {  // P = causal(s (Q K^T) o Gamma) -> p, this warp's [16 x 16] tile
      Tile64 qk = {};
      warp_tile_mma<kHeadDim, 1, 2>(RowMajor{s.q, kLdBf16}, ColMajor{s.k, kLdBf16}, c_m0, c_n0, qk);
      for_each_acc_pair<1, 2>(c_m0, c_n0, qk, [&](int i, int jc, float& c0, float& c1) {
        float2 const gate = causal_gates(s.gcum, i, jc);
        float const e0 = gate.x;
        float const e1 = gate.y;
        st2(s.p, kLdC, i, jc, scale * c0 * e0, scale * c1 * e1);
      });
    }
    __syncthreads();  // B2: Rt, R, T, P complete

    // ---- B
    {
      Tile delta = {};
      warp_tile_mma<kChunk, 1, kOutNi>(RowMajor{s.t, kLdC}, RowMajor{s.r, kLdBf16}, o_m0, o_n0,
                                       delta);
      float lo, hi;
      dot_rows(kds, delta, lo, hi);
      store_row_parts(lo, hi, s.kdsd, o_part, o_m0);
      store_acc_bf16<1, kOutNi>(o_m0, o_n0, delta, s.delta, kLdBf16);
    }
    for_each_acc_pair<1, kOutNi>(o_m0, o_n0, kds, [&](int i, int, float& c0, float& c1) {
      float const eb = by_row(i, eb_lo, eb_hi);
      c0 *= eb;
      c1 *= eb;
    });
    warp_tile_mma<kChunk, 1, kOutNi>(ColMajor{s.p, kLdC}, RowMajor{s.dout, kLdBf16}, o_m0, o_n0,
                                     kds);
    store_acc_bf16<1, kOutNi>(o_m0, o_n0, kds, s.ddelta, kLdBf16);
    // dDelta - bf16(dDelta): Z's diagonal term T_ii dDelta_i (T_ii = 1) in fp32, not bf16
    for_each_acc_pair<1, kOutNi>(o_m0, o_n0, kds, [&](int, int, float& c0, float& c1) {
      c0 -= __bfloat162float(__float2bfloat16_rn(c0));
      c1 -= __bfloat162float(__float2bfloat16_rn(c1));
    });
    __syncthreads();  // B3: Delta, dDelta complete

    // ---- C1
    {
      Tile& z = kds;  // Z = T^T dDelta, from dDelta's rounding residual on the diagonal
      warp_tile_mma<kChunk, 1, kOutNi>(ColMajor{s.t, kLdC}, RowMajor{s.ddelta, kLdBf16}, o_m0, o_n0,
                                       z);
      float lo, hi;
      dot_rows(z, rt, lo, hi);
      store_row_parts(lo, hi, s.zrt, o_part, o_m0);
      for_each_acc_pair<1, kOutNi>(o_m0, o_n0, z, [&](int i, int c, float& c0, float& c1) {
        float const b = by_row(i, b_lo, b_hi);
        float const be = b * by_row(i, e_lo, e_hi);
        if (p.dv != nullptr && i < len)  // p in the constant bank: no register for the test
          *reinterpret_cast<__nv_bfloat162*>(p.dv + ((t0 + i) * HV + hv) * kHeadDim + c) =
              __floats2bfloat162_rn(b * c0, b * c1);
        st2(s.v, kLdBf16, i, c, -be * c0, -be * c1);  // Zs
      });
    }
    __syncthreads();  // B4: Z's readers of T done; Zs complete

    // ---- C2
    // dT = mask(dDelta R^T): gate sums of T o dT, dA = Gamma o dT -> t (in place)
    masked_gate_grad(RowMajor{s.ddelta, kLdBf16}, ColMajor{s.r, kLdBf16}, s.t, 1.f, true, s, c_m0,
                     c_n0);
    // dP = mask(dO Delta^T): gate sums of P o dP, dQK = s Gamma o dP -> p (in place)
    masked_gate_grad(RowMajor{s.dout, kLdBf16}, ColMajor{s.delta, kLdBf16}, s.p, scale, false, s,
                     c_m0, c_n0);
    __syncthreads();  // B5: dA, dQK complete; dDelta and R no longer read

    // ---- D1
    for (int idx = tid; idx < kChunk * kHeadDim / 2; idx += kThreads) {
      int const i = idx / (kHeadDim / 2);
      int const c = idx % (kHeadDim / 2) * 2;
      float const se = scale * __expf(s.gcum[i]);
      float2 const d = ld2(s.dout, kLdBf16, i, c);
      st2(s.ddelta, kLdBf16, i, c, se * d.x, se * d.y);  // eO
    }
    {
      Tile64 y = {};
      warp_tile_mma<kChunk, 1, 2>(ColMajor{s.a, kLdC}, RowMajor{s.t, kLdC}, c_m0, c_n0, y);
      store_acc_bf16<1, 2>(c_m0, c_n0, y, s.r, kLdC);
    }
    {
      Tile dq = {};
      warp_tile_mma<kHeadDim, 1, kOutNi>(RowMajor{s.dout, kLdBf16}, ColMajor{s.h, kLdBf16}, o_m0,
                                         o_n0, dq);
      float lo, hi;
      dot_rows(dq, s.q, kLdBf16, o_m0, o_n0, lo, hi);
      store_row_parts(lo, hi, s.oqh, o_part, o_m0);
      for_each_acc_pair<1, kOutNi>(o_m0, o_n0, dq, [&](int i, int, float& c0, float& c1) {
        float const se = scale * by_row(i, e_lo, e_hi);
        c0 *= se;
        c1 *= se;
      });
      warp_tile_mma<kChunk, 1, kOutNi>(RowMajor{s.p, kLdC}, RowMajor{s.k, kLdBf16}, o_m0, o_n0, dq);
      float* const out = p.dq + (t0 * HV + hv) * kHeadDim;
      for_each_acc_pair<1, kOutNi>(o_m0, o_n0, dq, [&](int i, int c, float& c0, float& c1) {
        if (i < len) *reinterpret_cast<float2*>(out + i * v_stride + c) = make_float2(c0, c1);
      });
    }
    __syncthreads();  // B6: eO, Y complete; dA and dO no longer read

    // eO's rounding residual, with an initial state (Params::eo_split): bf16(eO) costs dh0 ~1.4x
    // FLA's error (whose product runs in TF32), and nothing else measurably
    // (tools/precision/walk_bwd_rounding.cpp).
    // eO_lo = bf16(s e dO - bf16(s e dO)) -> dout, in place (each thread its own elements)
    bool const eo_split = p.eo_split;  // the same for every thread: the barrier is safe
    if (eo_split) {
      for (int idx = tid; idx < kChunk * kHeadDim / 2; idx += kThreads) {
        int const i = idx / (kHeadDim / 2);
        int const c = idx % (kHeadDim / 2) * 2;
        float const se = scale * __expf(s.gcum[i]);
        float2 const d = ld2(s.dout, kLdBf16, i, c);
        float2 const hi = ld2(s.ddelta, kLdBf16, i, c);
        st2(s.dout, kLdBf16, i, c, se * d.x - hi.x, se * d.y - hi.y);
      }
      __syncthreads();  // B6b: eO_lo complete
    }

    // ---- D2: dS of the previous chunk's end (registers; bf16(dS) in ds stays the old one)
    for_each_acc_pair<1, kStateCols / 8>(row0, col0, ds, [&](int, int, float& c0, float& c1) {
      c0 *= gamma;
      c1 *= gamma;
    });
    warp_tile_mma<kChunk, 1, kStateCols / 8>(ColMajor{s.q, kLdBf16}, RowMajor{s.ddelta, kLdBf16},
                                             row0, col0, ds);
    if (eo_split)
      warp_tile_mma<kChunk, 1, kStateCols / 8>(ColMajor{s.q, kLdBf16}, RowMajor{s.dout, kLdBf16},
                                               row0, col0, ds);
    warp_tile_mma<kChunk, 1, kStateCols / 8>(ColMajor{s.k, kLdBf16}, RowMajor{s.v, kLdBf16}, row0,
                                             col0, ds);
    {  // dL = -strict(Y A^T) -> t, M = beta dL -> m
      Tile64 yl = {};
      warp_tile_mma<kChunk, 1, 2>(RowMajor{s.r, kLdC}, ColMajor{s.a, kLdC}, c_m0, c_n0, yl);
      for_each_acc_pair<1, 2>(c_m0, c_n0, yl, [&](int i, int jc, float& c0, float& c1) {
        float const d0 = jc < i ? -c0 : 0.f;
        float const d1 = jc + 1 < i ? -c1 : 0.f;
        float const b = s.beta[i];
        st2(s.t, kLdC, i, jc, d0, d1);
        st2(m, kChunk, i, jc, b * d0, b * d1);
      });
    }
    __syncthreads();  // B7: dL, M complete

    // ---- D3: dk
    {
      Tile dk = {};
      Tile x = {};
      warp_tile_mma<kHeadDim, 1, kOutNi>(RowMajor{s.v, kLdBf16}, ColMajor{s.h, kLdBf16}, o_m0, o_n0,
                                         dk);
      float lo, hi;
      dot_rows(dk, s.k, kLdBf16, o_m0, o_n0, lo, hi);
      store_row_parts(lo, hi, s.zkh, o_part, o_m0);
      warp_tile_mma<kChunk, 1, kOutNi>(ColMajor{s.p, kLdC}, RowMajor{s.q, kLdBf16}, o_m0, o_n0, dk);
      warp_tile_mma<kChunk, 1, kOutNi>(ColMajor{m, kChunk}, RowMajor{s.k, kLdBf16}, o_m0, o_n0, dk);
      warp_tile_mma<kHeadDim, 1, kOutNi>(RowMajor{s.delta, kLdBf16}, ColMajor{s.ds, kLdBf16}, o_m0,
                                         o_n0, x);
#pragma unroll
      for (int ni = 0; ni < kOutNi; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          dk[0][ni][e] += (e < 2 ? eb_lo : eb_hi) * x[0][ni][e];
          x[0][ni][e] = 0.f;
        }
      warp_tile_mma<kChunk, 1, kOutNi>(RowMajor{s.t, kLdC}, RowMajor{s.k, kLdBf16}, o_m0, o_n0, x);
      dot_rows(x, s.k, kLdBf16, o_m0, o_n0, lo, hi);
      store_row_parts(lo, hi, s.dlk, o_part, o_m0);
      float* const out = p.dk + (t0 * HV + hv) * kHeadDim;
#pragma unroll
      for (int ni = 0; ni < kOutNi; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[0][ni][e] += (e < 2 ? b_lo : b_hi) * x[0][ni][e];
      for_each_acc_pair<1, kOutNi>(o_m0, o_n0, dk, [&](int i, int c, float& c0, float& c1) {
        if (i < len) *reinterpret_cast<float2*>(out + i * v_stride + c) = make_float2(c0, c1);
      });
    }
    // E of this chunk runs after the next chunk's loads are issued (its row sums stay until the
    // next chunk's B1): G is kept for it now, before B8 lets those loads overwrite gcum
    if (warp == 0) {
      s.g_prev[lane] = s.gcum[lane];
      s.g_prev[lane + 32] = s.gcum[lane + 32];
    }
    __syncthreads();  // B8: every row sum and g_prev complete; every tile's readers done

  }
  if (warp == 0 && num_chunks > 0) finish_rows(s, p, span.begin, span.chunk_len(0), hv);

  if (p.dh0 != nullptr) store_state_rows<kStateCols>(ds, row0, p.dh0, state_offset + col0);
#endif
}

}  // namespace cake::kernels::walk_a_bwd
