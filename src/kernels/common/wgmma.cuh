// Warpgroup products (Hopper wgmma) on bf16 tiles in shared memory.
//
// Why: mma.sync reads its operands per warp tile with ldmatrix, ~384 bytes of shared memory per
// 16x8x16 product at 16 x 32 warp tiles, and that traffic bounds cake's walks and chunk kernels
// (docs/perf-notes.md). wgmma reads A [64 x 16] and B [16 x N] once per warpgroup (4 warps):
// for N = 128 about a quarter of the bytes per FLOP.
//
// Layout ("blocked"): a tile of R x C bf16 elements, row-major in global memory, is stored as
// 8 x 8 core matrices of 128 contiguous bytes (8 rows of 16 bytes), core (r / 8, c / 8) at
// ((r / 8) (C / 8) + c / 8) x 128 bytes, element (r, c) at byte (r % 8) x 16 + (c % 8) x 2 within
// it. Without swizzling this is wgmma's canonical layout for both majors, with the byte offsets
// between core matrices along K (LBO) and along M or N (SBO):
//   rows = M or N, columns = K   (K-major):    LBO = 128,          SBO = (C / 8) x 128
//   rows = K, columns = M or N   (M/N-major):  LBO = (C / 8) x 128, SBO = 128
// so one copy of a tile serves as either operand of either product (Q as A of Q h; K as B of
// Q K^T, K-major, and as A of K^T Delta, M-major). ldmatrix reads the same layout conflict-free
// (each core matrix is one 8 x 16-byte ldmatrix matrix).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace cake::kernels {

// Element offset of (r, c) in a blocked tile of kCols columns.
template <int kCols>
__device__ __forceinline__ int blocked_offset(int r, int c) {
  static_assert(kCols % 8 == 0, "blocked tiles have whole core matrices");
  return ((r / 8) * (kCols / 8) + c / 8) * 64 + (r % 8) * 8 + c % 8;
}

// Steps between blocked offsets: blocked_offset(r, c + 8) = blocked_offset(r, c) + kNext8Cols and
// blocked_offset(r + 8, c) = blocked_offset(r, c) + kNext8Rows<kCols>. Written as such, offsets of
// a loop over column blocks fold into the addresses (the compiler does not see through
// (8 j + 2 q) / 8 and keeps one address register per block).
inline constexpr int kNext8Cols = 64;
template <int kCols>
inline constexpr int kNext8Rows = kCols / 8 * 64;

// dst (blocked, kRows x kCols) <- src[r * row_stride + c], rows at or past `valid` zero-filled;
// 16-byte cp.async copies, all in flight. Asynchronous: cp_async_wait, fence_proxy_async_shared
// (the wgmma reads through the async proxy), then a barrier. A row is copied by kThreads / kRows
// threads (one where there are fewer threads than rows, over several passes), thread q of them
// taking the row's vectors q, q + kThreads / kRows, ..., so that
// - its global and shared-memory addresses are one base each plus constants per pass (with an
//   address per copy, the copies' addresses take registers the roles do not have, and each copy
//   waits for the one before to read its address: measured at workload A, docs/perf-notes.md);
// - a warp's copy of one vector index reads whole 32-byte sectors (a row's threads take adjacent
//   vectors) and writes whole 128-byte core-matrix rows of shared memory.
// tid: this thread's index among the kThreads that copy (a warpgroup role passes its own
// numbering).
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_tile_blocked_async(__nv_bfloat16* dst,
                                                        __nv_bfloat16 const* src,
                                                        int64_t row_stride, int valid, int tid) {
  constexpr int kVecs = kCols / 8;
  constexpr int kRowThreads = kThreads >= kRows ? kThreads / kRows : 1;
  constexpr int kPassRows = kThreads / kRowThreads;
  static_assert(kThreads % kRowThreads == 0 && kVecs % kRowThreads == 0 && kRows % kPassRows == 0 &&
                    kPassRows % 8 == 0,
                "each thread copies whole vectors of one row per pass, a pass whole core matrices");
  int const q = tid % kRowThreads;
#pragma unroll
  for (int pass = 0; pass < kRows / kPassRows; ++pass) {
    int const r = tid / kRowThreads + pass * kPassRows;
    bool const ok = r < valid;
    __nv_bfloat16* const d = dst + blocked_offset<kCols>(r, 8 * q);
    __nv_bfloat16 const* const s = ok ? src + r * row_stride + 8 * q : src;
#pragma unroll
    for (int v = 0; v < kVecs / kRowThreads; ++v)
      cp_async_16(d + v * kRowThreads * kNext8Cols, s + v * kRowThreads * 8, ok);
  }
}

// A wgmma matrix descriptor: start address, LBO and SBO in bytes (16-byte units in the
// descriptor), no swizzle, base offset 0.
__device__ __forceinline__ uint64_t wgmma_descriptor(void const* start, uint32_t lbo,
                                                     uint32_t sbo) {
  uint32_t const addr = static_cast<uint32_t>(__cvta_generic_to_shared(start));
  return uint64_t{(addr >> 4) & 0x3FFFu} | uint64_t{(lbo >> 4) & 0x3FFFu} << 16 |
         uint64_t{(sbo >> 4) & 0x3FFFu} << 32;
}

// Operand views of blocked tiles of kCols columns.
// KMajorTile: rows are M (or N), columns are K. The operand at (mn0, k0): rows mn0.., K k0..+15.
template <int kCols>
struct KMajorTile {
  static constexpr int kTrans = 0;
  __nv_bfloat16 const* p;
  __device__ __forceinline__ uint64_t desc(int mn0, int k0) const {
    return wgmma_descriptor(p + blocked_offset<kCols>(mn0, k0), 128, kCols / 8 * 128);
  }
  // desc(mn0, k0) - desc(mn0, 0) for k0 a multiple of 8: k0 / 8 core matrices of 128 bytes, in
  // the descriptor's 16-byte units
  static constexpr uint64_t desc_step(int k0) { return uint64_t(k0 / 8) * 128 / 16; }
};
// MNMajorTile: rows are K, columns are M (or N). The operand at (mn0, k0): K rows k0..+15,
// columns mn0...
template <int kCols>
struct MNMajorTile {
  static constexpr int kTrans = 1;
  __nv_bfloat16 const* p;
  __device__ __forceinline__ uint64_t desc(int mn0, int k0) const {
    return wgmma_descriptor(p + blocked_offset<kCols>(k0, mn0), kCols / 8 * 128, 128);
  }
  // desc(mn0, k0) - desc(mn0, 0) for k0 a multiple of 8: k0 / 8 rows of kCols / 8 core matrices
  static constexpr uint64_t desc_step(int k0) { return uint64_t(k0 / 8) * (kCols / 8) * 128 / 16; }
};

// acc += A[m0 .. m0 + 63, 0 .. kKd) B[0 .. kKd, n0 .. n0 + kN) for this thread's warpgroup
// (kN = 32, 64 or 128; acc in the layout of ptx.cuh's wgmma): issues kKd / 16 wgmma and returns
// at once. A group of such products: fence_accumulators(acc) for each of its accumulators,
// wgmma_fence(), the products, wgmma_commit(), wgmma_wait<0>(), fence_accumulators(acc) again;
// nothing else touches the accumulators in between. Shared-memory operands written by this CTA
// need fence_proxy_async_shared() and a barrier before.
template <int kN, int kKd, class A, class B>
__device__ __forceinline__ void warpgroup_mma_async(A const& a, B const& b, int m0, int n0,
                                                    float (&acc)[kN / 2]) {
  static_assert(kN == 32 || kN == 64 || kN == 128, "wgmma widths built: 32, 64, 128");
  static_assert(kKd % 16 == 0, "the reduction length must be a multiple of 16");
  // The descriptors of the first k-step, then constant steps: the start address is the
  // descriptor's low field (shared-memory byte address / 16, below 2^14), so adding a step never
  // carries out of it. Formed per k-step, each descriptor cost ~7 instructions (address, shift,
  // masks, moves to uniform registers) between the wgmma of a group (SASS of walk_a_bwd).
  uint64_t const a0 = a.desc(m0, 0);
  uint64_t const b0 = b.desc(n0, 0);
  uint32_t const a_lo = static_cast<uint32_t>(a0), b_lo = static_cast<uint32_t>(b0);
  uint64_t const a_hi = a0 >> 32 << 32, b_hi = b0 >> 32 << 32;
#pragma unroll
  for (int k0 = 0; k0 < kKd; k0 += 16) {
    uint64_t const da = a_hi | (a_lo + static_cast<uint32_t>(A::desc_step(k0)));
    uint64_t const db = b_hi | (b_lo + static_cast<uint32_t>(B::desc_step(k0)));
    if constexpr (kN == 32)
      wgmma_m64n32k16_bf16<A::kTrans, B::kTrans>(acc, da, db);
    else if constexpr (kN == 64)
      wgmma_m64n64k16_bf16<A::kTrans, B::kTrans>(acc, da, db);
    else
      wgmma_m64n128k16_bf16<A::kTrans, B::kTrans>(acc, da, db);
  }
}

// One product, complete on return: fence, issue, commit, wait.
template <int kN, int kKd, class A, class B>
__device__ __forceinline__ void warpgroup_mma(A const& a, B const& b, int m0, int n0,
                                              float (&acc)[kN / 2]) {
  fence_accumulators(acc);
  wgmma_fence();
  warpgroup_mma_async<kN, kKd>(a, b, m0, n0, acc);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(acc);
}

// For each pair of adjacent accumulator elements of this thread, f(r, c, c_j, c_j+1) with (r, c)
// the row and column in the [64 x kN] product at (m0, n0).
template <int kN, class F>
__device__ __forceinline__ void for_each_wgmma_pair(int m0, int n0, float (&acc)[kN / 2],
                                                    F const& f) {
  int const lane = threadIdx.x % 32;
  int const r = m0 + 16 * (threadIdx.x % 128 / 32) + lane / 4;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    int const c = n0 + 8 * j + 2 * (lane % 4);
    f(r, c, acc[4 * j], acc[4 * j + 1]);
    f(r + 8, c, acc[4 * j + 2], acc[4 * j + 3]);
  }
}

// for_each_wgmma_pair with, for each pair, the element offset `at` of (r, c) in a blocked tile of
// kCols columns (m0 and n0 multiples of 8): f(r, c, at, c_j, c_j+1). The offsets are one base
// plus constants (kNext8Cols, kNext8Rows), so they fold into the addresses: formed per pair, each
// would be a register the compiler keeps (and, in a warpgroup role with few registers, spills).
template <int kCols, int kN, class F>
__device__ __forceinline__ void for_each_blocked_pair(int m0, int n0, float (&acc)[kN / 2],
                                                      F const& f) {
  int const lane = threadIdx.x % 32;
  int const r = m0 + 16 * (threadIdx.x % 128 / 32) + lane / 4;
  int const c = n0 + 2 * (lane % 4);
  int const at = blocked_offset<kCols>(r, c);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    f(r, c + 8 * j, at + kNext8Cols * j, acc[4 * j], acc[4 * j + 1]);
    f(r + 8, c + 8 * j, at + kNext8Rows<kCols> + kNext8Cols * j, acc[4 * j + 2], acc[4 * j + 3]);
  }
}

// "Swizzled" tiles (the 128-byte swizzle): what TMA boxes of 64 columns x kRows rows write with
// CU_TENSOR_MAP_SWIZZLE_128B. Columns in halves of 64, each kRows x 128 bytes (1024-byte
// aligned); row r of a half at r x 128 bytes, its 16-byte chunk q at (q XOR r % 8) x 16. wgmma
// reads them with the swizzle mode set, SBO 1024 (8 rows) and, M/N-major, LBO a half's bytes
// (CUTLASS's canonical layouts, mma_traits_sm90_gmma.hpp). Offsets in elements.
template <int kRows>
__device__ __forceinline__ int swizzled_offset(int r, int c) {
  return (c / 64) * kRows * 64 + r * 64 + ((c % 64 / 8) ^ (r % 8)) * 8 + c % 8;
}
__device__ __forceinline__ uint64_t wgmma_descriptor_sw128(void const* start, uint32_t lbo,
                                                           uint32_t sbo) {
  return wgmma_descriptor(start, lbo, sbo) | uint64_t{1} << 62;
}
// The operand at (mn0, k0), rows M (N) and columns K; its start unswizzled (the swizzle applies
// to the addresses wgmma forms from it).
template <int kRows>
struct KMajorSwizzledTile {
  static constexpr int kTrans = 0;
  __nv_bfloat16 const* p;
  __device__ __forceinline__ uint64_t desc(int mn0, int k0) const {
    return wgmma_descriptor_sw128(p + k0 / 64 * kRows * 64 + mn0 * 64 + k0 % 64, 16, 1024);
  }
  static constexpr uint64_t desc_step(int k0) {
    return uint64_t(k0 / 64 * kRows * 64 + k0 % 64) * 2 / 16;
  }
};
// Rows K, columns M (N); mn0 a multiple of 64, or of 32 for an operand of N = 32: its start is
// then 64 bytes into the 128-byte rows of a half, and the swizzle, applied to the addresses wgmma
// forms, finds the same chunks as for the whole half (as KMajorSwizzledTile's k0 % 64 does).
template <int kRows>
struct MNMajorSwizzledTile {
  static constexpr int kTrans = 1;
  __nv_bfloat16 const* p;
  __device__ __forceinline__ uint64_t desc(int mn0, int k0) const {
    return wgmma_descriptor_sw128(p + mn0 / 64 * kRows * 64 + k0 * 64 + mn0 % 64, kRows * 128,
                                  1024);
  }
  static constexpr uint64_t desc_step(int k0) { return uint64_t(k0) * 128 / 16; }
};

// A warpgroup's [64 x kN] tile at rows m0.., columns n0.. of a blocked tile of kCols columns, as
// bf16 pairs in registers in for_each_wgmma_pair's layout and order: frag[q] holds the pair that
// for_each_wgmma_pair visits q-th (accumulators 2 q, 2 q + 1). One ldmatrix or stmatrix moves 4
// core matrices (the warp's 16 rows by 16 columns): against a 4-byte load or store per pair, a
// quarter of the instructions. Written per pair, the forward state roles' bf16(h) stores hold
// them 21 % of their time in MIO stalls at workload A; by fragments the forward takes 12.45 ms
// there against 12.56 (docs/perf-notes.md).
// Lane l addresses row l % 8 of core matrix l / 8: rows + 8 (l / 8 % 2), columns + 8 (l / 16).
template <int kCols>
__device__ __forceinline__ int frag_lane_offset(int m0, int n0) {
  int const lane = threadIdx.x % 32;
  return blocked_offset<kCols>(m0 + 16 * (threadIdx.x % 128 / 32) + lane / 8 % 2 * 8 + lane % 8,
                               n0 + lane / 16 * 8);
}
template <int kCols, int kN>
__device__ __forceinline__ void load_blocked_frag(__nv_bfloat16 const* tile, int m0, int n0,
                                                  uint32_t (&frag)[kN / 4]) {
  static_assert(kN % 16 == 0, "whole 16-column steps");
  __nv_bfloat16 const* const at = tile + frag_lane_offset<kCols>(m0, n0);
#pragma unroll
  for (int jj = 0; jj < kN / 16; ++jj) {
    uint32_t x[4];
    ldmatrix_x4(x, at + 2 * jj * kNext8Cols);
    for (int m = 0; m < 4; ++m) frag[4 * jj + m] = x[m];
  }
}
template <int kCols, int kN>
__device__ __forceinline__ void store_blocked_frag(__nv_bfloat16* tile, int m0, int n0,
                                                   uint32_t const (&frag)[kN / 4]) {
  static_assert(kN % 16 == 0, "whole 16-column steps");
  __nv_bfloat16* const at = tile + frag_lane_offset<kCols>(m0, n0);
#pragma unroll
  for (int jj = 0; jj < kN / 16; ++jj) {
    uint32_t const x[4] = {frag[4 * jj], frag[4 * jj + 1], frag[4 * jj + 2], frag[4 * jj + 3]};
    stmatrix_x4(at + 2 * jj * kNext8Cols, x);
  }
}
// load_blocked_frag / store_blocked_frag for a swizzled tile of kRows rows: an address per
// instruction (the swizzle does not step by constants).
template <int kRows, int kN>
__device__ __forceinline__ void load_swizzled_frag(__nv_bfloat16 const* tile, int m0, int n0,
                                                   uint32_t (&frag)[kN / 4]) {
  int const lane = threadIdx.x % 32;
  int const r = m0 + 16 * (threadIdx.x % 128 / 32) + lane / 8 % 2 * 8 + lane % 8;
#pragma unroll
  for (int jj = 0; jj < kN / 16; ++jj) {
    uint32_t x[4];
    ldmatrix_x4(x, tile + swizzled_offset<kRows>(r, n0 + 16 * jj + lane / 16 * 8));
    for (int m = 0; m < 4; ++m) frag[4 * jj + m] = x[m];
  }
}
template <int kRows, int kN>
__device__ __forceinline__ void store_swizzled_frag(__nv_bfloat16* tile, int m0, int n0,
                                                    uint32_t const (&frag)[kN / 4]) {
  int const lane = threadIdx.x % 32;
  int const r = m0 + 16 * (threadIdx.x % 128 / 32) + lane / 8 % 2 * 8 + lane % 8;
#pragma unroll
  for (int jj = 0; jj < kN / 16; ++jj) {
    uint32_t const x[4] = {frag[4 * jj], frag[4 * jj + 1], frag[4 * jj + 2], frag[4 * jj + 3]};
    stmatrix_x4(tile + swizzled_offset<kRows>(r, n0 + 16 * jj + lane / 16 * 8), x);
  }
}
// A bf16 pair as the 32 bits ldmatrix / stmatrix move, and back.
__device__ __forceinline__ uint32_t bf16x2_bits(__nv_bfloat162 x) {
  return *reinterpret_cast<uint32_t*>(&x);
}
__device__ __forceinline__ float2 bits_float2(uint32_t x) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&x));
}
// The accumulator acc (kN / 2 floats, for_each_wgmma_pair's layout) as bf16 pairs, the fragment
// that store_blocked_frag / store_swizzled_frag take.
template <int kN>
__device__ __forceinline__ void bf16_frag_of(float const (&acc)[kN / 2], uint32_t (&frag)[kN / 4]) {
#pragma unroll
  for (int q = 0; q < kN / 4; ++q)
    frag[q] = bf16x2_bits(__floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]));
}
// The accumulator acc -> the tile as bf16.
template <int kCols, int kN>
__device__ __forceinline__ void store_blocked_acc(__nv_bfloat16* tile, int m0, int n0,
                                                  float const (&acc)[kN / 2]) {
  uint32_t frag[kN / 4];
  bf16_frag_of<kN>(acc, frag);
  store_blocked_frag<kCols, kN>(tile, m0, n0, frag);
}
template <int kRows, int kN>
__device__ __forceinline__ void store_swizzled_acc(__nv_bfloat16* tile, int m0, int n0,
                                                   float const (&acc)[kN / 2]) {
  uint32_t frag[kN / 4];
  bf16_frag_of<kN>(acc, frag);
  store_swizzled_frag<kRows, kN>(tile, m0, n0, frag);
}

// acc -> this thread's rows r_lo and r_lo + 8 (for_each_wgmma_pair's layout) of a row-major
// global tensor, those below `valid`: lo points at element (r_lo, n0 + 2 (lane % 4)), row_stride
// is in elements, f(x0, x1, is_hi) gives the pair stored (float2, __nv_bfloat162, ...). One
// address per row, the column blocks at constant offsets from it: with an address formed per
// store, a role short of registers keeps one or two, and each store waits until the one before
// has read its address registers (measured: walk_a_bwd's dk stores; docs/perf-notes.md).
template <int kN, class T, class F>
__device__ __forceinline__ void store_wgmma_rows(T* lo, int64_t row_stride, int r_lo, int valid,
                                                 float const (&acc)[kN / 2], F const& f) {
  using Pair = decltype(f(0.f, 0.f, false));
  T* const hi = lo + 8 * row_stride;
#pragma unroll
  for (int jb = 0; jb < kN / 8; ++jb) {
    if (r_lo < valid)
      *reinterpret_cast<Pair*>(lo + 8 * jb) = f(acc[4 * jb], acc[4 * jb + 1], false);
    if (r_lo + 8 < valid)
      *reinterpret_cast<Pair*>(hi + 8 * jb) = f(acc[4 * jb + 2], acc[4 * jb + 3], true);
  }
}

// The sum over the 4 lanes of a quad (the lanes that hold one accumulator row in
// for_each_wgmma_pair's layout), in a fixed order: the row sums of a product.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The sum over the 8 lanes of a warp that hold one accumulator column (lanes with the same
// lane % 4), in a fixed order: the column sums of a product over a warp's 16 rows.
__device__ __forceinline__ float column_sum(float x) {
#pragma unroll
  for (int d = 4; d < 32; d *= 2) x += __shfl_xor_sync(0xffffffffu, x, d);
  return x;
}

}  // namespace cake::kernels
