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
// (the reach test, one block of S and P together, the pairs) are separate so that kkt_solve can
// spread them over its warps.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/problem.hpp"
#include "kernels/common/tile.cuh"

namespace cake::kernels::kkt_solve {

// fp32 rows of 136, 8 banks apart: the channel-pair (8-byte) loads of the 4 fragment rows of a
// half-warp in gated_tiles fall in distinct banks.
inline constexpr int kLdGate = kHeadDim + 8;
inline constexpr int kSubBlock = 16;
inline constexpr int kSubBlocks = kChunk / kSubBlock;
inline constexpr int kOffDiagonalBlocks = kSubBlocks * (kSubBlocks - 1) / 2;  // 6
// How far G may stray from a diagonal block's reference for the tensor-core form (above).
inline constexpr float kTensorCoreReach = 40.f;

// Whether one channel of a diagonal block, G at its 16 rows, stays within kTensorCoreReach of the
// block's reference on every row (a NaN fails every comparison, so it fails the test).
__device__ __forceinline__ bool channel_within_reach(float const (&g)[kSubBlock]) {
  float const ref = 0.5f * (g[0] + g[kSubBlock - 1]);
  bool within = true;
#pragma unroll
  for (int r = 0; r < kSubBlock; ++r) {
    float const d = g[r] - ref;
    within = within && d <= kTensorCoreReach && d >= -kTensorCoreReach;
  }
  return within;
}

inline constexpr unsigned kAllDiagonalBlocks = (1u << kSubBlocks) - 1u;

// The 16 x 16 blocks of a product on the tensor cores, as tasks over kkt_solve's 8 warps (warp w
// takes tasks w and w + 8): (2,0), (2,1), (3,2), (1,0), the diagonal blocks (0,0) .. (3,3), then
// (3,0), (3,1). The blocks of row blocks 2 and 3 off the diagonal read their row operands staged
// (stage_rows), so the two warps with two tasks take four of them.
inline constexpr int kTileTasks = kOffDiagonalBlocks + kSubBlocks;  // 10
__device__ __forceinline__ void tile_blocks(int task, int& a, int& b) {
  constexpr uint64_t kA = 0x33'3210'1322ull;  // a of task t in bits 4t..4t+3
  constexpr uint64_t kB = 0x10'3210'0210ull;
  a = static_cast<int>(kA >> (4 * task) & 0xfu);
  b = static_cast<int>(kB >> (4 * task) & 0xfu);
}

// The row operands x_i e^{G_i - G_n} (n = 16 a, the reference off the diagonal) of row block a do
// not depend on the column block, so for the row blocks with more than one block off the
// diagonal (a = 2, 3: 5 of the 6) they are formed once a value head (stage_rows: each element the
// same expression as gated_tiles forms it, so the same bits) into [channel step 8][x kX][fragment
// register 4][lane 32] words of bf16 pairs, and read by gated_tiles<kX, true>.
inline constexpr int kStagedFrom = 2;
template <int kX>
inline constexpr int kStagedWords = (kHeadDim / 16) * kX * 4 * 32;  // of one row block

// Row i's gated operands x_i e^{G_i - R} at channels c, c + 1 (R: the reference's G at them), for
// each of the kX row operands x, as bf16 pairs: the one expression that gated_tiles and
// stage_rows form, so that staged and formed operands are the same bits.
template <int kX>
__device__ __forceinline__ void gated_row_pairs(__nv_bfloat16 const* const (&x)[kX], float const* G,
                                                int i, int c, float2 R, uint32_t (&out)[kX]) {
  float2 const gi = *reinterpret_cast<float2 const*>(G + i * kLdGate + c);
  float const e0 = __expf(gi.x - R.x);
  float const e1 = __expf(gi.y - R.y);
#pragma unroll
  for (int t = 0; t < kX; ++t) {
    float2 const xi =
        __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(x[t] + i * kLdBf16 + c));
    out[t] = pack_bf16x2(xi.x * e0, xi.y * e1);
  }
}

// Block (a, b) of sum_c x_ic k_jc e^{G_ic - G_jc} on one warp's tensor cores for kX row operands x
// at once (k alone for S; k and q for S and P), into acc[x][ni] (the m16n8 accumulators of the
// block's columns 8 ni ..). The operands sharing the warp is what saves work: the column operand
// k_j e^{R - G_j} and the row factor e^{G_i - R} are formed once for every x (each element one
// exponential), and G, R and the operands are read as channel pairs (8-byte and 4-byte loads).
// Each element is the same fp32 expression as formed for one x alone, rounded to bf16 the same way,
// so the products are bitwise those of kX separate tiles.
//
// With kStaged, the row operands are read from staged (row block a's words, stage_rows) instead.
template <int kX, bool kStaged = false>
__device__ __forceinline__ void gated_tiles(__nv_bfloat16 const* const (&x)[kX],
                                            __nv_bfloat16 const* k, float const* G, int a, int b,
                                            float (&acc)[kX][2][4],
                                            uint32_t const* staged = nullptr) {
  int const lane = threadIdx.x % 32;
  int const i0 = a * kSubBlock + lane / 4;  // the row operand's rows i0, i0 + 8
  int const j0 = b * kSubBlock + lane / 4;  // the column operand's columns (rows of k) j0, j0 + 8
  float const* const gf = G + a * kSubBlock * kLdGate;     // block a's first row
  float const* const gl = gf + (kSubBlock - 1) * kLdGate;  // and last
  auto const pair = [](__nv_bfloat16 const* at) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(at));
  };
  // one channel step at a time: two in flight would spill at 128 registers
#pragma unroll 1
  for (int k0 = 0; k0 < kHeadDim; k0 += 16) {
    uint32_t xf[kX][4];  // m16k16 fragments: register 2 h + u holds row i0 + 8 u, channels c, c + 1
    uint32_t kf[2][2];   // k16n8 fragments: kf[u][h] holds column j0 + 8 u, channels c, c + 1
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int const c = k0 + 8 * h + 2 * (lane % 4);
      // R of channels c, c + 1: off the diagonal G_n, n block a's first row; on it the midpoint
      float2 R = *reinterpret_cast<float2 const*>(gf + c);
      if (a == b) {
        float2 const last = *reinterpret_cast<float2 const*>(gl + c);
        R = make_float2(0.5f * (R.x + last.x), 0.5f * (R.y + last.y));
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if constexpr (kStaged) {
#pragma unroll
          for (int t = 0; t < kX; ++t)
            xf[t][2 * h + u] = staged[((k0 / 16 * kX + t) * 4 + 2 * h + u) * 32 + lane];
        } else {
          uint32_t row[kX];
          gated_row_pairs(x, G, i0 + 8 * u, c, R, row);
#pragma unroll
          for (int t = 0; t < kX; ++t) xf[t][2 * h + u] = row[t];
        }
        int const j = j0 + 8 * u;
        float2 const gj = *reinterpret_cast<float2 const*>(G + j * kLdGate + c);
        float2 const kj = pair(k + j * kLdBf16 + c);
        kf[u][h] = pack_bf16x2(kj.x * __expf(R.x - gj.x), kj.y * __expf(R.y - gj.y));
      }
    }
#pragma unroll
    for (int t = 0; t < kX; ++t)
#pragma unroll
      for (int ni = 0; ni < 2; ++ni) mma_m16n8k16_bf16(acc[t][ni], xf[t], kf[ni]);
  }
}

// Row block a's (a > 0) staged row operands of channel step `step` on one warp, into staged (its
// kStagedWords<kX>): gated_tiles' expressions off the diagonal.
template <int kX>
__device__ __forceinline__ void stage_rows(__nv_bfloat16 const* const (&x)[kX], float const* G,
                                           int a, int step, uint32_t* staged) {
  int const lane = threadIdx.x % 32;
  int const i0 = a * kSubBlock + lane / 4;
  float const* const gf = G + a * kSubBlock * kLdGate;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int const c = 16 * step + 8 * h + 2 * (lane % 4);
    float2 const R = *reinterpret_cast<float2 const*>(gf + c);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      uint32_t row[kX];
      gated_row_pairs(x, G, i0 + 8 * u, c, R, row);
#pragma unroll
      for (int t = 0; t < kX; ++t) staged[((step * kX + t) * 4 + 2 * h + u) * 32 + lane] = row[t];
    }
  }
}

// The m16n8 accumulators of block (a, b) (gated_tiles) handed to put(i, j, v_j, v_j+1) for every
// pair of adjacent columns (j even) of the block.
template <class Put>
__device__ __forceinline__ void put_tile(float const (&acc)[2][4], int a, int b, Put const& put) {
  int const lane = threadIdx.x % 32;
  int const r = a * kSubBlock + lane / 4;
#pragma unroll
  for (int ni = 0; ni < 2; ++ni) {
    int const c = b * kSubBlock + 8 * ni + 2 * (lane % 4);
    put(r, c, acc[ni][0], acc[ni][1]);
    put(r + 8, c, acc[ni][2], acc[ni][3]);
  }
}

// The diagonal blocks that are not on the tensor cores (tensor_cores: the mask above), pair by
// pair: one pair per warp at a time, lane l sums channels l + 32 m, then the warp's butterfly (a
// fixed order: deterministic), then put(i, j, v) on lane 0. Row i holds the pairs j < i (j <= i
// with kDiagonal). Usually there are none, and the pair loop's index arithmetic alone cost ~8 %
// of kkt_solve's issue slots, so it is not entered then.
template <int kWarps, bool kDiagonal, class Put>
__device__ __forceinline__ void gated_pairs(__nv_bfloat16 const* x, __nv_bfloat16 const* k,
                                            float const* G, unsigned tensor_cores, Put const& put) {
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

}  // namespace cake::kernels::kkt_solve
