// The un-gated chunk inverse (step 1 of docs/design/gdn-hopper-v8-plan.md): one CTA per (chunk,
// value head).
//
//   G    = cumsum(g) within the chunk                                  [64]      fp32 out
//   L_ij = beta_i <k_i, k_j>  (i > j), strictly lower                  [64 x 64] fp32
//   A    = (I + L)^-1                                                  [64 x 64] bf16 out
//
// Why no gate: with Gamma_ij = e^{G_i - G_j} and D = diag(e^G), Gamma o L = D L D^-1, so the
// gated inverse T = (I + Gamma o L)^-1 = D A D^-1 = Gamma o A: the gate is applied elementwise
// where T is used (and e^{G_i - G_j} with i >= j never exceeds 1). beta's column scale (Delta is
// formed with T diag(beta)) is applied there too, not folded into A: the backward needs T itself
// (dbeta), which A diag(beta) would lose where beta_j = 0. Against intra_fwd this writes 8 KB of A
// per (chunk, value head) instead of W and U (32 KB), and skips the two [64 x 128] products that
// form them (walk_a_fwd rebuilds Delta from A). K K^T on the tensor cores (bf16 operands, fp32
// accumulation); the solve as intra_fwd's (common/tril_inverse.cuh, 3xTF32 merges); A rounded
// once to bf16. Also writes beta in fp32 for the walk (whatever beta's dtype).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/common/tril_inverse.cuh"
#include "kernels/kkt_solve/params.hpp"

namespace cake::kernels::kkt_solve {

inline constexpr int kThreads = kTrilThreads;
inline constexpr int kWarps = kThreads / 32;

// About 40 KB: A (fp32) takes K's place once K K^T is done. Three CTAs per SM (78 registers;
// at four the device find_chunk pushed it over 64 registers into spills).
struct SharedStorage {
  union {
    __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128] keys (zero past the end)
    float t[kChunk * kLd64];            // [64 x 64]  A, fp32, written by the solve
  };
  float l[kChunk * kLd64];  // [64 x 64] L
  float y[kTrilScratch];    // the solve's scratch
  float gcum[kChunk];       // G
  float beta[kChunk];       // 0 past the end
};

__global__ void __launch_bounds__(kThreads, 3) kkt_solve_kernel(__grid_constant__ Params const p) {
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

  load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                              int64_t{H} * kHeadDim, len);
  cp_async_commit();
  if (tid < kChunk) {
    int64_t const row = (c.t0 + tid) * HV + hv;
    s.gcum[tid] = tid < len ? p.g[row] : 0.f;
    s.beta[tid] = tid < len ? load_scalar(p.beta, row, p.beta_is_bf16) : 0.f;
  }
  __syncthreads();
  warp_cumsum64(s.gcum);
  cp_async_wait<0>();
  __syncthreads();  // K, G, beta visible
  if (tid < len) {
    p.gcum[(c.t0 + tid) * HV + hv] = s.gcum[tid];
    if (p.beta_f32 != nullptr) p.beta_f32[(c.t0 + tid) * HV + hv] = s.beta[tid];
  }

  // L = strictly-lower(beta_i (K K^T)_ij)
  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.k, kLdBf16}, ColMajor{s.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
        float const bi = s.beta[i];
        *reinterpret_cast<float2*>(s.l + i * kLd64 + j) =
            make_float2(i > j ? bi * c0 : 0.f, i > j + 1 ? bi * c1 : 0.f);
      });
  __syncthreads();  // L complete; K no longer read (A overwrites it)

  invert_unit_lower_64(s.l, s.t, s.y);

  // A -> a, rows of the chunk, two columns per thread and step (4-byte stores, 128 bytes a row)
  __nv_bfloat16* const a = p.a + (c.t0 * HV + hv) * kChunk;
  int64_t const stride = int64_t{HV} * kChunk;
  for (int idx = tid; idx < len * kChunk / 2; idx += kThreads) {
    int const i = idx / (kChunk / 2);
    int const j = idx % (kChunk / 2) * 2;
    *reinterpret_cast<__nv_bfloat162*>(a + i * stride + j) =
        __floats2bfloat162_rn(s.t[i * kLd64 + j], s.t[i * kLd64 + j + 1]);
  }
#endif
}

}  // namespace cake::kernels::kkt_solve
