// The conv's forward (src/ref/conv1d.hpp has the maths):
//   y[t] = act(sum_{i < W} weight[:, i] e[t - (W - 1) + i] + bias) + residual[t]
// conv1d_fwd_kernel: a block owns kTileTokens consecutive tokens of the pack and kThreads * kVec
// channels; each thread walks its tile's tokens in order for its kVec channels, keeping the W - 1
// tokens before the current one in registers, so x is read once plus W - 1 halo tokens per tile
// (3 / 128 more at W = 4, read by the threads themselves), and y written once (kVec channels a
// thread, straight from registers). The tile's rows of x and the residual come through the
// block's ring (conv1d::RowRing): bulk copies of 8-token stages, kRingStages slots, issued by warp
// 0. A document start inside the tile resets the halo to the document's initial state (or zeros):
// documents never see each other's tokens.
// Bytes in flight, 16-bit x, D >= 512 (fp32: the same bytes, 4-token stages): a stage is 8 KB a
// tensor, the ring 3 stages (24 KB with x alone, 48 KB with the residual, plus 128 bytes of
// barriers); while a block computes a stage the next two are in flight, 16 KB (32 KB) a block.
// __launch_bounds__(kThreads, kBlocksPerSm) holds registers to 128 a thread (ptxas: 67-112, no
// spills), so 4 blocks share an SM (16 warps; 96 KB or 192 KB of its 227 KB of shared memory):
// 64 KB (128 KB) in flight an SM, where the copy bandwidth of an H100 (~3 TB/s over 132 SMs) with
// ~1 us of loaded latency needs ~25 KB.
// conv1d_state_kernel: final_state[n, :, s] = e[L - W + s], one thread per (document, channel),
// also for empty documents (their initial state, or zeros).
#pragma once

#include "kernels/common/conv1d.cuh"
#include "kernels/conv1d_fwd/params.hpp"

namespace cake::kernels::conv1d_fwd {

using conv1d::Documents;
// Channels per thread.
template <class T>
inline constexpr int kVec = channels_per_thread(sizeof(T));

inline constexpr int kThreads = 128;
inline constexpr int kTileTokens = 128;
inline constexpr int kBlocksPerSm = 4;
template <class T>
using Ring = conv1d::RowRing<T, kThreads, kVec<T>>;
inline constexpr int kStateThreads = 128;

__device__ __forceinline__ Documents documents(Params const& p) {
  return {p.cu_seqlens, p.cu_int64, p.seq_len, p.num_seqs};
}

// x: token tiles, y: channel blocks (the y limit of 65535 allows D up to 2^23 channels).
template <class T>
inline conv1d::Grid tile_grid(Params const& p) {
  return {conv1d::blocks(p.num_tokens, kTileTokens), conv1d::blocks(p.dim, kThreads * kVec<T>)};
}

// The ring of x, and of the residual when there is one.
inline size_t tile_shared_bytes(Params const& p) {
  return conv1d::ring_shared_bytes(p.residual != nullptr ? 2 : 1);
}

inline conv1d::Grid state_grid(Params const& p) {
  return {static_cast<unsigned>(p.num_seqs), conv1d::blocks(p.dim, kStateThreads)};
}

inline bool has_tiles(Params const& p) { return p.num_tokens > 0 && p.dim > 0; }
inline bool has_states(Params const& p) {
  return p.final_state != nullptr && p.num_seqs > 0 && p.dim > 0;
}

template <class T, int W>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    conv1d_fwd_kernel(__grid_constant__ Params const p) {
  constexpr int V = kVec<T>;
  extern __shared__ __align__(16) char smem_raw[];
  int const c0 = static_cast<int>(blockIdx.y) * kThreads * V;
  int const d = c0 + static_cast<int>(threadIdx.x) * V;
  // Threads past D stay for the block barriers of the ring and store nothing.
  bool const active = d < p.dim;
  int64_t const t0 = int64_t{blockIdx.x} * kTileTokens;
  int64_t const t1 = t0 + kTileTokens < p.num_tokens ? t0 + kTileTokens : p.num_tokens;

  T const* x = static_cast<T const*>(p.x);
  T const* residual = static_cast<T const*>(p.residual);
  Ring<T> const inputs(smem_raw, x, residual, t0, static_cast<int>(t1 - t0), p.dim, c0, p.bulk_rows,
                       p.vectorised);
  inputs.start();

  float w[W][V], b[V];
  conv1d::load_taps<V, W>(p.weight, p.weight_dtype, p.bias, p.bias_dtype, p.dim, d, w, b);

  Documents const docs = documents(p);
  int64_t n = docs.of(t0);
  int64_t bos = docs.start(n), eos = docs.start(n + 1);
  // halo[k] = e[t - (W - 1) + k] of the current token t's document, k < W - 1.
  float halo[W - 1][V] = {};
  auto const fill_halo = [&](int64_t t) {
    if (!active) return;
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      conv1d::extended<T, W, V>(x, p.initial_state, p.initial_state_dtype, p.dim, p.vectorised, n,
                                bos, t - (W - 1) + k, d, halo[k]);
    }
  };
  fill_halo(t0);

  T* y = static_cast<T*>(p.y);
  for (int stage = 0; stage < inputs.stages(); ++stage) {
    inputs.acquire(stage);
#pragma unroll
    for (int k = 0; k < Ring<T>::K; ++k) {
      int64_t const t = t0 + stage * Ring<T>::K + k;
      if (t >= t1) break;
      if (t >= eos) {  // a document starts at t (after any empty ones)
        n = docs.of(t);
        bos = docs.start(n);
        eos = docs.start(n + 1);
        fill_halo(t);
      }
      float xt[V], rt[V];
      inputs.read(stage, 0, k, xt);
      if (residual != nullptr) inputs.read(stage, 1, k, rt);
      float out[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float pre = b[j];
#pragma unroll
        for (int h = 0; h < W - 1; ++h) pre = fmaf(w[h][j], halo[h][j], pre);
        pre = fmaf(w[W - 1][j], xt[j], pre);
        out[j] = conv1d::activate(p.activation, pre) + (residual != nullptr ? rt[j] : 0.f);
      }
      if (active) conv1d::store_row<T, V>(y + t * p.dim, d, p.dim, p.vectorised, out);
#pragma unroll
      for (int h = 0; h < W - 2; ++h) {
#pragma unroll
        for (int j = 0; j < V; ++j) halo[h][j] = halo[h + 1][j];
      }
#pragma unroll
      for (int j = 0; j < V; ++j) halo[W - 2][j] = xt[j];
    }
    inputs.release(stage);
  }
}

// One thread per (document, channel): blockIdx.x is the document.
template <class T, int W>
__global__ void __launch_bounds__(kStateThreads)
    conv1d_state_kernel(__grid_constant__ Params const p) {
  int const d = static_cast<int>(blockIdx.y) * kStateThreads + static_cast<int>(threadIdx.x);
  int64_t const n = blockIdx.x;
  if (d >= p.dim) return;
  Documents const docs = documents(p);
  int64_t const bos = docs.start(n), eos = docs.start(n + 1);
  T const* x = static_cast<T const*>(p.x);
#pragma unroll
  for (int s = 0; s < W; ++s) {
    float const value = conv1d::extended_one<T, W>(x, p.initial_state, p.initial_state_dtype, p.dim,
                                                   n, bos, eos - W + s, d);
    conv1d::store_small(p.final_state, p.final_state_dtype, (n * p.dim + d) * W + s, value);
  }
}

}  // namespace cake::kernels::conv1d_fwd
