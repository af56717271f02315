// The gated products of a per-channel decay (ChannelDecay, KDA), for one chunk and value head:
//
//   S_ij = sum_c k_ic k_jc e^{G_ic - G_jc}        i > j   (x = k, kDiagonal false)
//   P_ij = s sum_c q_ic k_jc e^{G_ic - G_jc}      i >= j  (x = q, kDiagonal true)
//
// (nothing else of the output is written). With x = k this is the gated K K^T of the solve; with
// x = q the output's intra-chunk attention.
// G is the chunk-local cumsum of log decays (non-increasing down a column), so e^{G_i - G_j} <= 1
// for i >= j, but its two halves e^{G_i} and e^{-G_j} are not: at g = -20 a chunk spans e^-1280,
// far past fp32. The chunk is cut into four 16-row blocks, and every block product is formed on
// the tensor cores with the operands x_i e^{G_i - R} and k_j e^{R - G_j} for a reference R per
// channel, whose product is e^{G_i - G_j} (operands rounded to bf16 after the scale, as K itself
// is; fp32 accumulation):
//   off-diagonal blocks (row block a > column block b): R = G_n, n the first row of block a;
//     i in block a, so G_i <= G_n; j < n, so G_j >= G_n: both factors <= 1, nothing overflows,
//     and a factor that underflows belongs to a product that is smaller still. Always safe.
//   diagonal blocks (a = b): R = (G_f + G_l) / 2, f and l the block's first and last rows. The
//     factors are as large as e^{|G_i - R|}; where every row of every channel has |G_i - R| <=
//     kTensorCoreReach (e^40 ~ 2.4e17: room for |x|, |k| up to ~1e21 before fp32's and bf16's
//     largest; e^-40 stays a normal number), the block takes the tensor cores; past it
//     (decays that strong inside 16 tokens, or a G that is not finite), pair by pair in fp32,
//     e^{G_ic - G_jc} per channel. The test reads G only: the same path on every run.
// x, k: bf16 [64][kLdBf16], rows past the chunk's end zero; G: fp32 [64][kLdGate]. The parts
// (the span test, one tile, the pairs) are separate so that kkt_solve can interleave the tiles of
// S and P over its warps; channel_gated_product forms one product into a shared fp32 tile.
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
// How far G may stray from a diagonal block's reference for the tensor-core form (above).
inline constexpr float kTensorCoreReach = 40.f;

// The reference of diagonal block a for channel c: halfway between its first and last rows.
__device__ __forceinline__ float diagonal_reference(float const* G, int a, int c) {
  return 0.5f * (G[a * kSubBlock * kLdGate + c] + G[(a * kSubBlock + kSubBlock - 1) * kLdGate + c]);
}

// Whether every row of diagonal block a stays within kTensorCoreReach of its reference on every
// channel (each warp decides alone, by a vote over its lanes' channels: all warps decide alike;
// a NaN fails every comparison, so it fails the test).
__device__ __forceinline__ bool diagonal_on_tensor_cores(float const* G, int a) {
  bool within = true;
#pragma unroll
  for (int m = 0; m < kHeadDim / 32; ++m) {
    int const c = threadIdx.x % 32 + 32 * m;
    float const ref = diagonal_reference(G, a, c);
#pragma unroll 4
    for (int r = a * kSubBlock; r < (a + 1) * kSubBlock; ++r) {
      float const d = G[r * kLdGate + c] - ref;
      within = within && d <= kTensorCoreReach && d >= -kTensorCoreReach;
    }
  }
  return __ballot_sync(0xffffffffu, !within) == 0u;
}

// Bit a set: diagonal block a on the tensor cores (the same answer in every warp).
__device__ __forceinline__ unsigned diagonal_blocks_on_tensor_cores(float const* G) {
  unsigned mask = 0;
#pragma unroll
  for (int a = 0; a < kSubBlocks; ++a) mask |= diagonal_on_tensor_cores(G, a) ? 1u << a : 0u;
  return mask;
}
inline constexpr unsigned kAllDiagonalBlocks = (1u << kSubBlocks) - 1u;

// The 16 x 16 blocks of a product on the tensor cores: task t < 6 is the off-diagonal block (a, b)
// in the order (1,0), (2,0), (2,1), (3,0), (3,1), (3,2); task 6 + a the diagonal block a.
inline constexpr int kTileTasks = kOffDiagonalBlocks + kSubBlocks;  // 10
__device__ __forceinline__ void tile_blocks(int task, int& a, int& b) {
  if (task >= kOffDiagonalBlocks) {
    a = b = task - kOffDiagonalBlocks;
    return;
  }
  a = 1;
  b = task;
  while (b >= a) {
    b -= a;
    ++a;
  }
}

// Block (a, b) of sum_c x_ic k_jc e^{G_ic - G_jc} on one warp's tensor cores, handed to
// put(i, j, v_j, v_j+1) for every pair of adjacent columns (j even) of the block.
template <class Put>
__device__ __forceinline__ void gated_tile(__nv_bfloat16 const* x, __nv_bfloat16 const* k,
                                           float const* G, int a, int b, Put const& put) {
  int const lane = threadIdx.x % 32;
  float const* const gn = G + a * kSubBlock * kLdGate;  // the off-diagonal reference row
  auto const reference = [&](int c) { return a != b ? gn[c] : diagonal_reference(G, a, c); };
  auto const row = [&](int i, int c) {
    return __bfloat162float(x[i * kLdBf16 + c]) * __expf(G[i * kLdGate + c] - reference(c));
  };
  auto const col = [&](int c, int j) {
    return __bfloat162float(k[j * kLdBf16 + c]) * __expf(reference(c) - G[j * kLdGate + c]);
  };
  float acc[1][2][4] = {};
  warp_tile_mma<kHeadDim, 1, 2>(row, col, a * kSubBlock, b * kSubBlock, acc);
  int const r = a * kSubBlock + lane / 4;
#pragma unroll
  for (int ni = 0; ni < 2; ++ni) {
    int const c = b * kSubBlock + 8 * ni + 2 * (lane % 4);
    put(r, c, acc[0][ni][0], acc[0][ni][1]);
    put(r + 8, c, acc[0][ni][2], acc[0][ni][3]);
  }
}

// The diagonal blocks that are not on the tensor cores (tensor_cores: the mask above), pair by
// pair: one pair per warp at a time, lane l sums channels l + 32 m, then the warp's butterfly (a
// fixed order: deterministic), then put(i, j, v) on lane 0. Row i holds the pairs j < i (j <= i
// with kDiagonal). Usually there are none, and the pair loop's index arithmetic alone cost ~8 %
// of kkt_solve's issue slots, so it is not entered then.
template <int kWarps, bool kDiagonal, class Put>
__device__ __forceinline__ void gated_pairs(__nv_bfloat16 const* x, __nv_bfloat16 const* k,
                                            float const* G, unsigned tensor_cores,
                                            Put const& put) {
  // pairs (i, j) of one diagonal block: 120 with i > j, 136 with i >= j
  constexpr int kPairsPerBlock = kSubBlock * (kSubBlock + (kDiagonal ? 1 : -1)) / 2;
  if (tensor_cores == kAllDiagonalBlocks) return;
  int const warp = threadIdx.x / 32;
  int const lane = threadIdx.x % 32;
  for (int p = warp; p < kSubBlocks * kPairsPerBlock; p += kWarps) {
    int const a = p / kPairsPerBlock;
    if (tensor_cores >> a & 1u) continue;
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
    if (lane == 0) put(ri, rj, sum);
  }
}

// One product into a shared fp32 tile out [64][kLd64], by a CTA of kWarps warps: warp w takes
// the tensor-core tasks w, w + kWarps, ..., then the pairs. On a diagonal block only i > j
// (i >= j with kDiagonal) is written. No barrier inside (the caller syncs before reading out).
template <int kWarps, bool kDiagonal>
__device__ __forceinline__ void channel_gated_product(__nv_bfloat16 const* x,
                                                      __nv_bfloat16 const* k, float const* G,
                                                      float scale, float* out) {
  static_assert(kWarps >= kOffDiagonalBlocks, "one warp per off-diagonal block at most");
  unsigned const tensor_cores = diagonal_blocks_on_tensor_cores(G);
  for (int task = threadIdx.x / 32; task < kTileTasks; task += kWarps) {
    int a, b;
    tile_blocks(task, a, b);
    if (a == b && !(tensor_cores >> a & 1u)) continue;
    auto const put1 = [&](int i, int j, float v) {
      if (a != b || j < i || (kDiagonal && j == i)) out[i * kLd64 + j] = scale * v;
    };
    gated_tile(x, k, G, a, b, [&](int i, int j, float v0, float v1) {
      put1(i, j, v0);
      put1(i, j + 1, v1);
    });
  }
  gated_pairs<kWarps, kDiagonal>(x, k, G, tensor_cores,
                                 [&](int i, int j, float v) { out[i * kLd64 + j] = scale * v; });
}

}  // namespace cake::kernels::kkt_solve
