// Intra-chunk part of dDelta (B3 of fla_reference.md §2.5): one CTA per (chunk, value head).
//   A        = causal(scale (Q K^T)_ij e^{G_i - G_j})   (i >= j)    [64 x 64], as in walk_a_fwd
//   dDelta_a = A^T dO                                               [64 x 128] fp32 out
// The state walk (state_bwd) adds the inter-chunk part in place.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/dv_local_bwd/params.hpp"

namespace cake::kernels::dv_local_bwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kLdA = kChunk + 8;  // bf16 A: 144-byte rows, ldmatrix conflict-free

struct SharedStorage {
  __nv_bfloat16 q[kChunk * kLdBf16];     // [64 x 128]
  __nv_bfloat16 k[kChunk * kLdBf16];     // [64 x 128]
  __nv_bfloat16 dout[kChunk * kLdBf16];  // [64 x 128]
  __nv_bfloat16 a[kChunk * kLdA];        // [64 x 64] bf16(A)
  float gcum[kChunk];
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "dv_local_bwd shared memory exceeds 227 KB");

__global__ void __launch_bounds__(kThreads) dv_local_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  ChunkRef c;
  if (!find_chunk(p.problem, blockIdx.x, c)) return;
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
      s.dout, kLdBf16, p.dout + (c.t0 * HV + hv) * kHeadDim, v_stride, len);
  cp_async_commit();
  if (tid < kChunk) s.gcum[tid] = p.gcum[(c.t0 + (tid < len ? tid : len - 1)) * HV + hv];
  cp_async_wait<0>();
  __syncthreads();

  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.q, kLdBf16}, ColMajor{s.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
        float const gi = s.gcum[i];
        *reinterpret_cast<__nv_bfloat162*>(s.a + i * kLdA + j) = __floats2bfloat162_rn(
            i >= j ? scale * c0 * __expf(gi - s.gcum[j]) : 0.f,
            i >= j + 1 ? scale * c1 * __expf(gi - s.gcum[j + 1]) : 0.f);
      });
  __syncthreads();

  // dDelta_intra = A^T dO
  float* const dv_new = p.dv_new + (c.t0 * HV + hv) * kHeadDim;
  block_gemm<kChunk, kHeadDim, kChunk, 2, 4, kWarps>(
      ColMajor{s.a, kLdA}, RowMajor{s.dout, kLdBf16}, [&](int j, int col, float c0, float c1) {
        if (j < len) *reinterpret_cast<float2*>(dv_new + j * v_stride + col) = make_float2(c0, c1);
      });
#endif
}

}  // namespace cake::kernels::dv_local_bwd
