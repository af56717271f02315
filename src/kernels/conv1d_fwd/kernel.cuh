// The conv's forward (src/ref/conv1d.hpp has the maths):
//   y[t] = act(sum_{i < W} weight[:, i] e[t - (W - 1) + i] + bias) + residual[t]
// conv1d_fwd_kernel: a block owns kTileTokens consecutive tokens of the pack and kThreads * kVec
// channels; each thread walks its tile's tokens in order for its kVec channels, keeping the W - 1
// tokens before the current one in registers, so x is read once plus W - 1 halo tokens per tile
// (3 / 64 more at W = 4), and y written once. Tokens are loaded kBatch at a time ahead of the
// arithmetic (independent 16-byte loads in flight). A document start inside the tile resets the
// halo to the document's initial state (or zeros): documents never see each other's tokens.
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
inline constexpr int kTileTokens = 64;
inline constexpr int kBatch = 8;  // token loads issued together
inline constexpr int kStateThreads = 128;

__device__ __forceinline__ Documents documents(Params const& p) {
  return {p.cu_seqlens, p.cu_int64, p.seq_len, p.num_seqs};
}

// x: token tiles, y: channel blocks (the y limit of 65535 allows D up to 2^23 channels).
template <class T>
inline conv1d::Grid tile_grid(Params const& p) {
  return {conv1d::blocks(p.num_tokens, kTileTokens), conv1d::blocks(p.dim, kThreads * kVec<T>)};
}

inline conv1d::Grid state_grid(Params const& p) {
  return {static_cast<unsigned>(p.num_seqs), conv1d::blocks(p.dim, kStateThreads)};
}

inline bool has_tiles(Params const& p) { return p.num_tokens > 0 && p.dim > 0; }
inline bool has_states(Params const& p) {
  return p.final_state != nullptr && p.num_seqs > 0 && p.dim > 0;
}

template <class T, int W>
__global__ void __launch_bounds__(kThreads) conv1d_fwd_kernel(__grid_constant__ Params const p) {
  constexpr int V = kVec<T>;
  int const d = (static_cast<int>(blockIdx.y) * kThreads + static_cast<int>(threadIdx.x)) * V;
  if (d >= p.dim) return;
  int64_t const t0 = int64_t{blockIdx.x} * kTileTokens;
  int64_t const t1 = t0 + kTileTokens < p.num_tokens ? t0 + kTileTokens : p.num_tokens;

  float w[W][V], b[V];
  conv1d::load_taps<V, W>(p.weight, p.weight_dtype, p.bias, p.bias_dtype, p.dim, d, w, b);

  Documents const docs = documents(p);
  int64_t n = docs.of(t0);
  int64_t bos = docs.start(n), eos = docs.start(n + 1);
  T const* x = static_cast<T const*>(p.x);
  // halo[k] = e[t - (W - 1) + k] of the current token t's document, k < W - 1.
  float halo[W - 1][V];
  auto const fill_halo = [&](int64_t t) {
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      conv1d::extended<T, W, V>(x, p.initial_state, p.initial_state_dtype, p.dim, p.vectorised, n,
                                bos, t - (W - 1) + k, d, halo[k]);
    }
  };
  fill_halo(t0);

  T const* residual = static_cast<T const*>(p.residual);
  T* y = static_cast<T*>(p.y);
  for (int64_t tb = t0; tb < t1; tb += kBatch) {
    float xs[kBatch][V], rs[kBatch][V];
    int const count = t1 - tb < kBatch ? static_cast<int>(t1 - tb) : kBatch;
    conv1d::load_rows<T, V, kBatch>(x + tb * p.dim, p.dim, count, d, p.dim, p.vectorised, xs);
    if (residual != nullptr) {
      conv1d::load_rows<T, V, kBatch>(residual + tb * p.dim, p.dim, count, d, p.dim,
                                      p.vectorised, rs);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      int64_t const t = tb + k;
      if (t >= t1) break;
      if (t >= eos) {  // a document starts at t (after any empty ones)
        n = docs.of(t);
        bos = docs.start(n);
        eos = docs.start(n + 1);
        fill_halo(t);
      }
      float out[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float pre = b[j];
#pragma unroll
        for (int i = 0; i < W - 1; ++i) pre = fmaf(w[i][j], halo[i][j], pre);
        pre = fmaf(w[W - 1][j], xs[k][j], pre);
        out[j] = conv1d::activate(p.activation, pre) + (residual != nullptr ? rs[k][j] : 0.f);
      }
      conv1d::store_row<T, V>(y + t * p.dim, d, p.dim, p.vectorised, out);
#pragma unroll
      for (int h = 0; h < W - 2; ++h) {
#pragma unroll
        for (int j = 0; j < V; ++j) halo[h][j] = halo[h + 1][j];
      }
#pragma unroll
      for (int j = 0; j < V; ++j) halo[W - 2][j] = xs[k][j];
    }
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
