// T = (I + L)^-1 for L = strict(diag(beta) S): S a [64 x 64] fp32 matrix in shared memory with
// rows of kLd64 floats (only its strictly lower part is read), beta [64] fp32 in shared memory;
// L is never formed (its rows are S's scaled by beta, applied where S is read). By a CTA of
// kTrilThreads threads (kkt_solve):
//   diagonal blocks T_aa = (I + L_aa)^-1: warp a < 4, lane j < 16 walks column j down by forward
//   substitution in registers (fp32, no barrier): T_ij = delta_ij - beta_i sum_m<i S_im T_mj;
//   lanes 16-31 of warps 0 and 2 zero the upper 16-blocks of the two diagonal 32-blocks (the
//   64x64 merge reads those 32-blocks whole); T's upper 32-block is left unwritten (the caller
//   stores zeros above the diagonal);
//   merge to 32x32:  T_10 = -T_11 (L_10 T_00) = -T_11 diag(beta_1) (S_10 T_00)  for the 16-blocks
//   (1, 0) and (3, 2);
//   merge to 64x64:  the same for the 32-blocks.
// The merges are warp products on the tensor cores in 3xTF32 (about fp32 accuracy, as FLA's
// ieee-precision merges), 8 columns per warp: the columns of a merged block are independent, so
// no warp waits for another. y: kTrilScratch floats of scratch. Ends with a barrier (T complete).
#pragma once

#include <type_traits>

#include "kernels/common/gemm_tf32x3.cuh"
#include "kernels/common/problem.hpp"
#include "kernels/common/tile.cuh"

namespace cake::kernels {

inline constexpr int kTrilThreads = 256;
inline constexpr int kTrilBlock = 16;        // diagonal blocks of the substitution
inline constexpr int kTrilScratchRows = 32;  // per merging warp: Y = L_10 T_00, up to 32 x 8
inline constexpr int kTrilLdScratch = 8;
inline constexpr int kTrilScratch = 4 * kTrilScratchRows * kTrilLdScratch;

__device__ __forceinline__ void invert_unit_lower_64(float const* s, float const* beta, float* t,
                                                     float* y) {
  int const tid = threadIdx.x;
  constexpr int kB = kTrilBlock;
  int const warp = tid / 32;
  int const lane = tid % 32;
  if (warp < kChunk / kB) {
    int const a0 = warp * kB;
    if (lane < kB) {
      float col[kB];
#pragma unroll
      for (int i = 0; i < kB; ++i) {
        float sum = 0.f;
#pragma unroll
        for (int m = 0; m < i; ++m) sum += s[(a0 + i) * kLd64 + a0 + m] * col[m];
        col[i] = (i == lane ? 1.f : 0.f) - beta[a0 + i] * sum;
      }
#pragma unroll
      for (int i = 0; i < kB; ++i) t[(a0 + i) * kLd64 + a0 + lane] = col[i];
    } else if (warp % 2 == 0) {  // the 16-block right of this diagonal block: zero
#pragma unroll
      for (int i = 0; i < kB; ++i) t[(a0 + i) * kLd64 + a0 + lane] = 0.f;
    }
  }
  __syncthreads();  // diagonal blocks and the zeros visible
  int const g = lane / 4;
  int const q = lane % 4;
  // One merge T_10[:, n0 .. n0 + 8) = -T_11 (L_10 T_00[:, n0 .. n0 + 8)) of two kM-blocks at row
  // and column offset r0 (upper-left block), by one warp; Y = diag(beta) (S_10 T_00) goes through
  // the warp's scratch.
  auto const merge = [&](auto m_tiles, int r0, int n0) {
    constexpr int kMt = decltype(m_tiles)::value;
    constexpr int kM = 16 * kMt;
    float* const scratch = y + warp * kTrilScratchRows * kTrilLdScratch;
    float acc_y[kMt][4] = {};
    warp_mma_f32x3<kMt, kM>(s + (r0 + kM) * kLd64 + r0, kLd64, t + r0 * kLd64 + n0, kLd64, acc_y);
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      float const b_lo = beta[r0 + kM + 16 * mt + g];
      float const b_hi = beta[r0 + kM + 16 * mt + g + 8];
      *reinterpret_cast<float2*>(scratch + (16 * mt + g) * kTrilLdScratch + 2 * q) =
          make_float2(b_lo * acc_y[mt][0], b_lo * acc_y[mt][1]);
      *reinterpret_cast<float2*>(scratch + (16 * mt + g + 8) * kTrilLdScratch + 2 * q) =
          make_float2(b_hi * acc_y[mt][2], b_hi * acc_y[mt][3]);
    }
    __syncwarp();
    float tt[kMt][4] = {};
    warp_mma_f32x3<kMt, kM>(t + (r0 + kM) * kLd64 + r0 + kM, kLd64, scratch, kTrilLdScratch, tt);
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      float* const row = t + (r0 + kM + 16 * mt + g) * kLd64 + n0 + 2 * q;
      *reinterpret_cast<float2*>(row) = make_float2(-tt[mt][0], -tt[mt][1]);
      *reinterpret_cast<float2*>(row + 8 * kLd64) = make_float2(-tt[mt][2], -tt[mt][3]);
    }
  };
  if (warp < 4) {  // 16-blocks (1, 0) and (3, 2): warp w merges pair w / 2, columns 8 (w % 2)
    int const r0 = (warp / 2) * 2 * kB;
    merge(std::integral_constant<int, 1>{}, r0, r0 + (warp % 2) * 8);
  }
  __syncthreads();                                                     // 32x32 inverses complete
  if (warp < 4) merge(std::integral_constant<int, 2>{}, 0, warp * 8);  // 32-block (1, 0)
  __syncthreads();                                                     // T complete
}

}  // namespace cake::kernels
