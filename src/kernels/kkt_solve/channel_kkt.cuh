// The gated products of a per-channel decay (ChannelDecay, KDA), for one chunk and value head:
//
//   S_ij = sum_c k_ic k_jc e^{G_ic - G_jc}        i > j   (x = k, kDiagonal false)
//   P_ij = s sum_c q_ic k_jc e^{G_ic - G_jc}      i >= j  (x = q, kDiagonal true)
//
// (nothing else of the output is written). With x = k this is the gated K K^T of the solve; with
// x = q the output's intra-chunk attention.
// G is the chunk-local cumsum of log decays (non-increasing down a column), so e^{G_i - G_j} <= 1
// for i >= j, but its two halves e^{G_i} and e^{-G_j} are not: at g = -20 a chunk spans e^-1280,
// far past fp32. The chunk is cut into four 16-row blocks, each with a reference row n = its
// first row:
//   off-diagonal blocks (row block a > column block b): on the tensor cores, with the operands
//     x_i e^{G_i - G_n} (i in block a, G_i <= G_n) and k_j e^{G_n - G_j} (j < n, G_j >= G_n):
//     both factors <= 1 and their product is e^{G_i - G_j}, so nothing overflows, and a factor
//     that underflows belongs to a product that is smaller still. Operands rounded to bf16 after
//     the scale (as K itself is), fp32 accumulation.
//   diagonal blocks: pair by pair in fp32, e^{G_ic - G_jc} per channel (no reference row keeps
//     both factors of a pair inside one block below 1).
// x, k: bf16 [64][kLdBf16], rows past the chunk's end zero; G: fp32 [64][kLdGate]; out: fp32
// [64][kLd64]. By a CTA of kWarps warps; no barrier inside (the caller syncs before reading out).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/problem.hpp"
#include "kernels/common/tile.cuh"

namespace cake::kernels::kkt_solve {

// fp32 rows of 132: the 8 rows of an mma fragment's gather start 4 banks apart.
inline constexpr int kLdGate = kHeadDim + 4;
inline constexpr int kSubBlock = 16;
inline constexpr int kSubBlocks = kChunk / kSubBlock;
inline constexpr int kOffDiagonalBlocks = kSubBlocks * (kSubBlocks - 1) / 2;  // 6

template <int kWarps, bool kDiagonal>
__device__ __forceinline__ void channel_gated_product(__nv_bfloat16 const* x,
                                                      __nv_bfloat16 const* k, float const* G,
                                                      float scale, float* out) {
  // pairs (i, j) of one diagonal block: 120 with i > j, 136 with i >= j
  constexpr int kPairsPerBlock = kSubBlock * (kSubBlock + (kDiagonal ? 1 : -1)) / 2;
  static_assert(kWarps >= kOffDiagonalBlocks, "one warp per off-diagonal block");
  int const warp = threadIdx.x / 32;
  int const lane = threadIdx.x % 32;

  // Off-diagonal block w = (a, b) in the order (1,0), (2,0), (2,1), (3,0), (3,1), (3,2).
  if (warp < kOffDiagonalBlocks) {
    int a = 1;
    int b = warp;
    while (b >= a) {
      b -= a;
      ++a;
    }
    float const* const gn = G + a * kSubBlock * kLdGate;  // the reference row
    auto const row = [&](int i, int c) {
      return __bfloat162float(x[i * kLdBf16 + c]) * __expf(G[i * kLdGate + c] - gn[c]);
    };
    auto const col = [&](int c, int j) {
      return __bfloat162float(k[j * kLdBf16 + c]) * __expf(gn[c] - G[j * kLdGate + c]);
    };
    float acc[1][2][4] = {};
    warp_tile_mma<kHeadDim, 1, 2>(row, col, a * kSubBlock, b * kSubBlock, acc);
    int const r = a * kSubBlock + lane / 4;
#pragma unroll
    for (int ni = 0; ni < 2; ++ni) {
      int const c = b * kSubBlock + 8 * ni + 2 * (lane % 4);
      *reinterpret_cast<float2*>(out + r * kLd64 + c) =
          make_float2(scale * acc[0][ni][0], scale * acc[0][ni][1]);
      *reinterpret_cast<float2*>(out + (r + 8) * kLd64 + c) =
          make_float2(scale * acc[0][ni][2], scale * acc[0][ni][3]);
    }
  }

  // Diagonal blocks: one pair per warp at a time, lane l sums channels l + 32 m, then the warp's
  // butterfly (a fixed order: deterministic). Row i holds the pairs j < i (j <= i with kDiagonal).
  for (int p = warp; p < kSubBlocks * kPairsPerBlock; p += kWarps) {
    int const a = p / kPairsPerBlock;
    int i = kDiagonal ? 0 : 1;
    int j = p % kPairsPerBlock;
    while (j >= i + (kDiagonal ? 1 : 0)) {
      j -= i + (kDiagonal ? 1 : 0);
      ++i;
    }
    int const ri = a * kSubBlock + i;
    int const rj = a * kSubBlock + j;
    float sum = 0.f;
#pragma unroll
    for (int m = 0; m < kHeadDim / 32; ++m) {
      int const c = lane + 32 * m;
      sum += __bfloat162float(x[ri * kLdBf16 + c]) * __bfloat162float(k[rj * kLdBf16 + c]) *
             __expf(G[ri * kLdGate + c] - G[rj * kLdGate + c]);
    }
#pragma unroll
    for (int d = 16; d > 0; d /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, d);
    if (lane == 0) out[ri * kLd64 + rj] = scale * sum;
  }
}

}  // namespace cake::kernels::kkt_solve
