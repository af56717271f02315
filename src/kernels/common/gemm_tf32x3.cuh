// A warp's product of fp32 shared-memory matrices on the tensor cores at about fp32 accuracy:
// 3xTF32. Each operand x is split into big = tf32(x) and small = x - big (read as tf32), and
//   A B ~ A_small B_big + A_big B_small + A_big B_big       (the A_small B_small term dropped),
// three mma.m16n8k8.tf32 per step, fp32 accumulation: a relative error near 2^-21 rather than
// tf32's 2^-11. For small products that must stay fp32-exact in spirit (the chunk's triangular
// inverse, which the backward reads in fp32) but should not cost a CUDA-core loop per element.
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace cake::kernels {

// acc[mt] += A[16 mt .. 16 mt + 15][0 .. kK) B[0 .. kK)[0 .. 7] for mt < kMt: A row-major at a with
// leading dimension lda, B row-major at b with ldb (fp32, shared memory). acc[mt] is the mma
// accumulator layout: rows 16 mt + group (+ 8), columns 2 quad (+ 1) (ptx.cuh).
template <int kMt, int kK>
__device__ __forceinline__ void warp_mma_f32x3(float const* a, int lda, float const* b, int ldb,
                                               float (&acc)[kMt][4]) {
  static_assert(kK % 8 == 0, "the reduction runs in steps of 8");
  int const lane = threadIdx.x % 32;
  int const g = lane / 4;
  int const q = lane % 4;
  // big = x rounded to tf32 by its bits (half away from zero; finite x: the inputs here are
  // finite, and cvt.rna's Inf/NaN guard costs two more instructions per split on sm_90), small
  // = x - big exactly; small goes in unrounded, as the mma reads only a tf32 register's top 19
  // bits (truncating small moves the product by ~2^-22 of x, below the dropped small x small).
  // Three instructions per split where two cvt.rna take seven (kkt_solve is issue-bound).
  auto const split = [](float x, uint32_t& big, uint32_t& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
  };
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 8) {
    uint32_t b_big[2], b_small[2];
    split(b[(k0 + q) * ldb + g], b_big[0], b_small[0]);
    split(b[(k0 + q + 4) * ldb + g], b_big[1], b_small[1]);
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
      float const* const a_rows = a + (16 * mt + g) * lda + k0 + q;
      uint32_t a_big[4], a_small[4];
      split(a_rows[0], a_big[0], a_small[0]);
      split(a_rows[8 * lda], a_big[1], a_small[1]);
      split(a_rows[4], a_big[2], a_small[2]);
      split(a_rows[8 * lda + 4], a_big[3], a_small[3]);
      mma_m16n8k8_tf32(acc[mt], a_small, b_big);
      mma_m16n8k8_tf32(acc[mt], a_big, b_small);
      mma_m16n8k8_tf32(acc[mt], a_big, b_big);
    }
  }
}

}  // namespace cake::kernels
