// A block-wide matrix product on the tensor cores.
//
//   C[M x N] = A[M x Kd] B[Kd x N]   (bf16 operands, fp32 accumulation), then epi(i, j, c_j, c_j+1)
//   per pair of adjacent elements (so that stores can be 4- or 8-byte pairs).
//
// An operand is either a bf16 shared-memory view (RowMajor: element (r, c) at p[r ld + c];
// ColMajor: at p[c ld + r]), read with ldmatrix (.trans where the layout needs it), or a functor
// a(i, k) / b(k, j) returning the element as float (rounded to bf16 here), for operands with
// masks, scales or concatenations folded in; functors gather element by element and are slower.
// Each warp owns output tiles of (16 kMi) x (8 kNi), assigned round-robin; Kd runs in steps of 16.
// The epilogue sees every output element exactly once, always on the same thread for the same
// (M, N, kMi, kNi, warps), so two products of one shape may read-modify-write the same elements
// without a barrier between them.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace cake::kernels {

// bf16 shared-memory operand views; ld in elements, rows 16-byte aligned (ld % 8 == 0).
struct RowMajor {
  __nv_bfloat16 const* p;
  int ld;
};
struct ColMajor {
  __nv_bfloat16 const* p;
  int ld;
};

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// A fragment of the 16x16 tile at (m0, k0).
template <class A>
__device__ __forceinline__ void load_a_frag(A const& a, int m0, int k0, uint32_t (&f)[4]) {
  int const lane = threadIdx.x % 32;
  int const r = m0 + lane / 4;
  int const kc = k0 + 2 * (lane % 4);
  f[0] = pack_bf16x2(a(r, kc), a(r, kc + 1));
  f[1] = pack_bf16x2(a(r + 8, kc), a(r + 8, kc + 1));
  f[2] = pack_bf16x2(a(r, kc + 8), a(r, kc + 9));
  f[3] = pack_bf16x2(a(r + 8, kc + 8), a(r + 8, kc + 9));
}
__device__ __forceinline__ void load_a_frag(RowMajor const& a, int m0, int k0, uint32_t (&f)[4]) {
  int const lane = threadIdx.x % 32;
  int const mat = lane / 8;
  ldmatrix_x4(f, a.p + (m0 + (mat % 2) * 8 + lane % 8) * a.ld + k0 + (mat / 2) * 8);
}
__device__ __forceinline__ void load_a_frag(ColMajor const& a, int m0, int k0, uint32_t (&f)[4]) {
  int const lane = threadIdx.x % 32;
  int const mat = lane / 8;
  ldmatrix_x4_trans(f, a.p + (k0 + (mat / 2) * 8 + lane % 8) * a.ld + m0 + (mat % 2) * 8);
}

// B fragments of the two 16x8 tiles at (k0, n0) and (k0, n0 + 8).
template <class B>
__device__ __forceinline__ void load_b_frag2(B const& b, int k0, int n0, uint32_t (&f)[2][2]) {
  int const lane = threadIdx.x % 32;
  int const kc = k0 + 2 * (lane % 4);
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    int const c = n0 + 8 * t + lane / 4;
    f[t][0] = pack_bf16x2(b(kc, c), b(kc + 1, c));
    f[t][1] = pack_bf16x2(b(kc + 8, c), b(kc + 9, c));
  }
}
__device__ __forceinline__ void load_b_frag2(ColMajor const& b, int k0, int n0,
                                             uint32_t (&f)[2][2]) {
  int const lane = threadIdx.x % 32;
  int const mat = lane / 8;
  uint32_t r[4];
  ldmatrix_x4(r, b.p + (n0 + (mat / 2) * 8 + lane % 8) * b.ld + k0 + (mat % 2) * 8);
  f[0][0] = r[0];
  f[0][1] = r[1];
  f[1][0] = r[2];
  f[1][1] = r[3];
}
__device__ __forceinline__ void load_b_frag2(RowMajor const& b, int k0, int n0,
                                             uint32_t (&f)[2][2]) {
  int const lane = threadIdx.x % 32;
  int const mat = lane / 8;
  uint32_t r[4];
  ldmatrix_x4_trans(r, b.p + (k0 + (mat % 2) * 8 + lane % 8) * b.ld + n0 + (mat / 2) * 8);
  f[0][0] = r[0];
  f[0][1] = r[1];
  f[1][0] = r[2];
  f[1][1] = r[3];
}

// acc += A[m0 .. m0 + 16 kMi, 0 .. kKd) B[0 .. kKd, n0 .. n0 + 8 kNi) for one warp.
template <int kKd, int kMi, int kNi, class A, class B>
__device__ __forceinline__ void warp_tile_mma(A const& a, B const& b, int m0, int n0,
                                              float (&acc)[kMi][kNi][4]) {
  static_assert(kNi % 2 == 0, "B fragments are loaded for pairs of 8-column tiles");
  static_assert(kKd % 16 == 0, "the reduction length must be a multiple of 16");
#pragma unroll 2
  for (int k0 = 0; k0 < kKd; k0 += 16) {
    uint32_t af[kMi][4];
    uint32_t bf[kNi / 2][2][2];
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi) load_a_frag(a, m0 + 16 * mi, k0, af[mi]);
#pragma unroll
    for (int np = 0; np < kNi / 2; ++np) load_b_frag2(b, k0, n0 + 16 * np, bf[np]);
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) mma_m16n8k16_bf16(acc[mi][ni], af[mi], bf[ni / 2][ni % 2]);
  }
}

// Row sums without atomics. Bitwise determinism is a product promise (the same inputs give the
// same bits on every run and stream), so no floating-point sum may depend on warp scheduling: a
// sum spread over warps is written as one partial per slot (each slot by exactly one thread),
// and after a barrier one thread per sum adds the slots in ascending slot order.
//
// The sum of the kParts partials of element i of a [kParts][kM] array, in ascending part order.
// Only after a barrier that follows every write of the partials.
template <int kM, int kParts>
__device__ __forceinline__ float sum_parts(float const* parts, int i) {
  float sum = parts[i];
#pragma unroll
  for (int t = 1; t < kParts; ++t) sum += parts[t * kM + i];
  return sum;
}

// C = A B on a CTA: warp w takes the [16 kMi x 8 kNi] output tiles w, w + kWarps, ... (column
// tiles fastest), then epi(i, j, c_j, c_j+1) for every pair of adjacent elements (j even).
template <int kM, int kN, int kKd, int kMi, int kNi, int kWarps, class A, class B, class Epi>
__device__ __forceinline__ void block_gemm(A const& a, B const& b, Epi const& epi) {
  static_assert(kM % (16 * kMi) == 0, "M must be a multiple of the warp tile rows (16 kMi)");
  static_assert(kN % (8 * kNi) == 0, "N must be a multiple of the warp tile columns (8 kNi)");
  constexpr int kTilesM = kM / (16 * kMi);
  constexpr int kTilesN = kN / (8 * kNi);
  int const warp = threadIdx.x / 32;
  int const lane = threadIdx.x % 32;
  int const group = lane / 4;
  int const quad = lane % 4;
  for (int tile = warp; tile < kTilesM * kTilesN; tile += kWarps) {
    int const m0 = (tile / kTilesN) * 16 * kMi;
    int const n0 = (tile % kTilesN) * 8 * kNi;
    float acc[kMi][kNi][4];
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;
    warp_tile_mma<kKd, kMi, kNi>(a, b, m0, n0, acc);
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
        int const r = m0 + 16 * mi + group;
        int const c = n0 + 8 * ni + 2 * quad;
        epi(r, c, acc[mi][ni][0], acc[mi][ni][1]);
        epi(r + 8, c, acc[mi][ni][2], acc[mi][ni][3]);
      }
  }
}

}  // namespace cake::kernels
