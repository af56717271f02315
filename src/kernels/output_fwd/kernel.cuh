// Output stage (F6 of fla_reference.md §2.2): one CTA per (chunk, value head).
//   A = causal(scale (Q K^T)_ij e^{G_i - G_j})   (i >= j)          [64 x 64]  fp32 in shared memory
//   O = scale e^G (Q h) + A Delta                                   [64 x 128] -> o (bf16)
// The two products of O accumulate in the same registers: Q h first, scaled per row in fp32,
// then A Delta on top.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/output_fwd/params.hpp"

namespace cake::kernels::output_fwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kLdA = kChunk + 8;  // bf16 A: 144-byte rows, ldmatrix conflict-free

struct SharedStorage {
  __nv_bfloat16 q[kChunk * kLdBf16];      // [64 x 128]
  __nv_bfloat16 k[kChunk * kLdBf16];      // [64 x 128]
  __nv_bfloat16 delta[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 h[kHeadDim * kLdBf16];    // [128 x 128]
  __nv_bfloat16 a[kChunk * kLdA];         // [64 x 64] bf16(A)
  float gcum[kChunk];
  float q_scale[kChunk];                  // scale e^{G_i}
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "output_fwd shared memory exceeds 227 KB");

__global__ void __launch_bounds__(kThreads) output_fwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  int64_t const slot = blockIdx.x;
  ChunkRef c;
  if (!find_chunk(p.problem, slot, c)) return;
  int const hv = blockIdx.y;
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const h = hv / p.problem.group_size();
  int const len = c.len;
  int const tid = threadIdx.x;
  float const scale = p.problem.scale;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  load_tile_async<kChunk, kHeadDim, kThreads>(s.q, kLdBf16, p.q + (c.t0 * H + h) * kHeadDim,
                                              int64_t{H} * kHeadDim, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                              int64_t{H} * kHeadDim, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(
      s.delta, kLdBf16, p.v_new + (c.t0 * HV + hv) * kHeadDim, v_stride, len);
  load_tile_async<kHeadDim, kHeadDim, kThreads>(
      s.h, kLdBf16, p.h + (slot * HV + hv) * kHeadDim * kHeadDim, kHeadDim, kHeadDim);
  cp_async_commit();
  if (tid < kChunk) {
    // Rows past the end repeat G of the last token so that no exponent there is large.
    float const gi = p.gcum[(c.t0 + (tid < len ? tid : len - 1)) * HV + hv];
    s.gcum[tid] = gi;
    s.q_scale[tid] = scale * __expf(gi);
  }
  cp_async_wait<0>();
  __syncthreads();

  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.q, kLdBf16}, ColMajor{s.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
        float const gi = s.gcum[i];
        *reinterpret_cast<__nv_bfloat162*>(s.a + i * kLdA + j) = __floats2bfloat162_rn(
            i >= j ? scale * c0 * __expf(gi - s.gcum[j]) : 0.f,
            i >= j + 1 ? scale * c1 * __expf(gi - s.gcum[j + 1]) : 0.f);
      });
  __syncthreads();  // A complete

  // O = scale e^{G_i} (Q h)_i + A Delta: the row scale goes onto the fp32 product (as FLA does),
  // not onto q before it is rounded to bf16 again
  __nv_bfloat16* const o = p.o + (c.t0 * HV + hv) * kHeadDim;
  block_gemm_mid<kChunk, kHeadDim, kHeadDim, kChunk, 2, 4, kWarps>(
      RowMajor{s.q, kLdBf16}, RowMajor{s.h, kLdBf16},
      [&](int i, int, float& c0, float& c1) {
        c0 *= s.q_scale[i];
        c1 *= s.q_scale[i];
        return 0.f;
      },
      nullptr, RowMajor{s.a, kLdA}, RowMajor{s.delta, kLdBf16},
      [&](int i, int col, float c0, float c1) {
        if (i < len)
          *reinterpret_cast<__nv_bfloat162*>(o + i * v_stride + col) =
              __floats2bfloat162_rn(c0, c1);
      });
#endif
}

}  // namespace cake::kernels::output_fwd
