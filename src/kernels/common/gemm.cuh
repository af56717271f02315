// A block-wide matrix product on the tensor cores with operands read through functors.
//
//   C[M x N] = A[M x Kd] B[Kd x N]   (bf16 operands, fp32 accumulation), then epi(i, j, c) per element.
//
// a(i, k) and b(k, j) return the operand element as float (it is rounded to bf16 here); they are
// usually reads of shared memory, with transposes, masks, row scales or concatenations folded in,
// which keeps every stage of the chunked algorithm one short call. Each warp owns output tiles of
// (16 kMi) x (8 kNi), assigned round-robin; Kd runs in steps of 16. The epilogue sees every output
// element exactly once, always on the same thread for the same (M, N, kMi, kNi, warps), so two
// products of one shape may read-modify-write the same elements without a barrier between them.
//
// Speed: operands are gathered element by element (scalar shared loads), so this runs well under
// the tensor-core peak; it is the correct-first building block (docs/design/gdn-hopper.md).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace cake::kernels {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int kM, int kN, int kKd, int kMi, int kNi, int kWarps, class A, class B, class Epi>
__device__ __forceinline__ void block_gemm(A const& a, B const& b, Epi const& epi) {
  static_assert(kM % (16 * kMi) == 0, "M must be a multiple of the warp tile rows (16 kMi)");
  static_assert(kN % (8 * kNi) == 0, "N must be a multiple of the warp tile columns (8 kNi)");
  static_assert(kKd % 16 == 0, "the reduction length must be a multiple of 16");
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
#pragma unroll 1
    for (int k0 = 0; k0 < kKd; k0 += 16) {
      uint32_t af[kMi][4];
      uint32_t bf[kNi][2];
      int const kc = k0 + 2 * quad;
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) {
        int const r = m0 + 16 * mi + group;
        af[mi][0] = pack_bf16x2(a(r, kc), a(r, kc + 1));
        af[mi][1] = pack_bf16x2(a(r + 8, kc), a(r + 8, kc + 1));
        af[mi][2] = pack_bf16x2(a(r, kc + 8), a(r, kc + 9));
        af[mi][3] = pack_bf16x2(a(r + 8, kc + 8), a(r + 8, kc + 9));
      }
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
        int const c = n0 + 8 * ni + group;
        bf[ni][0] = pack_bf16x2(b(kc, c), b(kc + 1, c));
        bf[ni][1] = pack_bf16x2(b(kc + 8, c), b(kc + 9, c));
      }
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNi; ++ni) mma_m16n8k16_bf16(acc[mi][ni], af[mi], bf[ni]);
    }
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
        int const r = m0 + 16 * mi + group;
        int const c = n0 + 8 * ni + 2 * quad;
        epi(r, c, acc[mi][ni][0]);
        epi(r, c + 1, acc[mi][ni][1]);
        epi(r + 8, c, acc[mi][ni][2]);
        epi(r + 8, c + 1, acc[mi][ni][3]);
      }
  }
}

}  // namespace cake::kernels
