// The conv's backward (src/ref/conv1d.hpp has the maths). With g[t] = dy[t] act'(pre[t]):
//   dx[s]      = sum_{i < W} weight[:, i] g[s + W - 1 - i]  (same document) + dht's column of s
//   dweight[:, i] = sum_t g[t] e[t - (W - 1) + i],   dbias = sum_t g[t],   dresidual = dy
//   dinitial_state[n, :, c] = sum_t weight[:, c - 1 - t] g[t] (t < W - 1) + dht[n, :, c - L]
// conv1d_bwd_kernel: a block owns a tile of tile_tokens tokens and kThreads * kVec channels; each
// thread walks its tile in order (plus the W - 1 tokens after it while they are in the tile's
// last document, whose g its last tokens' dx needs), recomputing pre[t] from x as the forward does
// (x and dy read once, plus halos), keeping the last W - 1 values of g in registers, and writes
// dx[s] once g up to s + W - 1 is known (at a document's last token, the pending ones, with the
// next document's g taken as zero). Its tile's sums of dweight and dbias go to the workspace, one
// row per tile. The walk's rows of x and dy come through the block's ring (conv1d::RowRing): bulk
// copies of 8-token stages (fp32: 4), kRingStages slots, issued by warp 0; the W - 1 rows before
// the tile are read by the threads themselves.
// Bytes in flight, 16-bit x, D >= 512 (fp32: the same bytes): a stage is 16 KB (x and dy), the
// ring 48 KB (plus 128 bytes of barriers); while a block computes a stage the next two are in
// flight, 32 KB a block. __launch_bounds__(kThreads, kBlocksPerSm) holds registers to 128 a thread
// (ptxas: 95-125, no spills), so 4 blocks share an SM (16 warps, 192 KB of its 227 KB of shared
// memory): 128 KB in flight an SM, where the copy bandwidth of an H100 (~3 TB/s over 132 SMs)
// with ~1 us of loaded latency needs ~25 KB.
// conv1d_state_bwd_kernel: dinitial_state, one thread per (document, channel).
// conv1d_reduce_kernel: dweight and dbias, each element the sum of the tiles' rows: 32 elements
// a block, warp w summing tiles w, w + 8, ... in tile order, then the eight warps' sums added in
// warp order (an order fixed by the shapes: bitwise reproducible).
#pragma once

#include "kernels/common/conv1d.cuh"
#include "kernels/conv1d_bwd/params.hpp"

namespace cake::kernels::conv1d_bwd {

using conv1d::Documents;
// Channels per thread.
template <class T>
inline constexpr int kVec = channels_per_thread(sizeof(T));

inline constexpr int kBlocksPerSm = 4;
template <class T>
using Ring = conv1d::RowRing<T, kThreads, kVec<T>>;
// The ring of x and dy.
inline constexpr size_t kTileSharedBytes = conv1d::ring_shared_bytes(2);
inline constexpr int kStateThreads = 128;
inline constexpr int kReduceThreads = 256;

__device__ __forceinline__ Documents documents(Params const& p) {
  return {p.cu_seqlens, p.cu_int64, p.seq_len, p.num_seqs};
}

// x: token tiles, y: channel blocks.
template <class T>
inline conv1d::Grid tile_grid(Params const& p) {
  return {static_cast<unsigned>(p.num_tiles), conv1d::blocks(p.dim, kThreads * kVec<T>)};
}
inline conv1d::Grid state_grid(Params const& p) {
  return {static_cast<unsigned>(p.num_seqs), conv1d::blocks(p.dim, kStateThreads)};
}
inline constexpr int kReduceWarps = kReduceThreads / 32;
// The reduction's shared memory (dynamic: the kernels' one form): each warp's 32 sums.
struct ReduceShared {
  float part[kReduceWarps][32];
};
inline conv1d::Grid reduce_grid(Params const& p) {
  return {conv1d::blocks(int64_t{p.dim} * (p.width + 1), 32), 1};
}
inline bool has_tiles(Params const& p) { return p.num_tokens > 0 && p.dim > 0; }
inline bool has_states(Params const& p) {
  return p.dinitial_state != nullptr && p.num_seqs > 0 && p.dim > 0;
}
inline bool has_reduce(Params const& p) {
  return (p.dweight != nullptr || p.dbias != nullptr) && p.dim > 0;
}

template <class T, int W>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    conv1d_bwd_kernel(__grid_constant__ Params const p) {
  constexpr int V = kVec<T>;
  constexpr int K = Ring<T>::K;
  extern __shared__ __align__(16) char smem_raw[];
  int const c0 = static_cast<int>(blockIdx.y) * kThreads * V;
  int const d = c0 + static_cast<int>(threadIdx.x) * V;
  // Threads past D stay for the block barriers of the ring and store nothing.
  bool const active = d < p.dim;
  int64_t const tile = blockIdx.x;
  int64_t const t0 = tile * p.tile_tokens;
  int64_t const t1 = t0 + p.tile_tokens < p.num_tokens ? t0 + p.tile_tokens : p.num_tokens;
  // The W - 1 tokens after the tile feed its last tokens' dx, as far as t1 - 1's document goes:
  // the walk is [t0, t_stop).
  Documents const docs = documents(p);
  int64_t const t_end = t1 + (W - 1) < p.num_tokens ? t1 + (W - 1) : p.num_tokens;
  int64_t const eos_last = docs.start(docs.of(t1 - 1) + 1);
  int64_t const t_stop = eos_last < t_end ? eos_last : t_end;
  // The walk's tokens t by their offset t - t0 (up to tile_tokens + W - 1: int).
  int const off1 = static_cast<int>(t1 - t0), off_end = static_cast<int>(t_end - t0);

  T const* x = static_cast<T const*>(p.x);
  T const* dy = static_cast<T const*>(p.dy);
  // Tensor 0 of the ring is x, tensor 1 dy. The W - 1 rows before the tile (its halo where they
  // are in t0's document) are issued before the weight loads and the document search.
  Ring<T> const inputs(smem_raw, x, dy, t0, static_cast<int>(t_stop - t0), p.dim, c0, p.bulk_rows,
                       p.vectorised);
  inputs.start();
  conv1d::RowBatch<T, V, W - 1> before;
#pragma unroll
  for (int k = 0; k < W - 1; ++k) {
    int64_t const q = t0 - (W - 1) + k;
    if (active && q >= 0) before.issue(k, x + q * p.dim, d, p.dim, p.vectorised);
  }

  float w[W][V], b[V];
  conv1d::load_taps<V, W>(p.weight, p.weight_dtype, p.bias, p.bias_dtype, p.dim, d, w, b);

  int64_t n = docs.of(t0);
  int64_t bos = docs.start(n), eos = docs.start(n + 1);
  // halo[k] = e[t - (W - 1) + k]; ring[k] = g[t - (W - 1) + k] of t's document (0 before it).
  float halo[W - 1][V] = {}, ring[W - 1][V];
  // The document in offsets: off_next, where the next one starts (past the walk: off_end + 1, so
  // that neither it nor its last token off_next - 1 is reached); dx[t - (W - 1)] is due at offsets
  // from off_out on (s = t - (W - 1) in the document and the tile).
  int off_next = 0, off_out = 0;
  // A document entered at t: its ring, bounds, and halo where e[q] is before the document (the
  // initial state or zeros); e[q] inside it occurs only at the tile's start (rows `before`).
  auto const enter_document = [&](int64_t t) {
#pragma unroll
    for (int k = 0; k < W - 1; ++k) {
      int64_t const q = t - (W - 1) + k;
      if (active && q < bos) {
        conv1d::extended<T, W, V>(x, p.initial_state, p.initial_state_dtype, p.dim, p.vectorised, n,
                                  bos, q, d, halo[k]);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) ring[k][j] = 0.f;
    }
    off_next = static_cast<int>(eos - t0 <= off_end ? eos - t0 : off_end + 1);
    off_out = static_cast<int>(bos > t0 ? bos - t0 : 0) + (W - 1);
  };
  enter_document(t0);
  // t0's document's tokens before the tile (a document entered inside the tile starts at the token
  // entering it, so has none before it).
#pragma unroll
  for (int k = 0; k < W - 1; ++k) {
    if (active && t0 - (W - 1) + k >= bos) before.unpack(k, halo[k]);
  }
  float dw[W][V] = {}, db[V] = {};

  bool const silu = p.activation == cakeActivationSilu;
  for (int stage = 0; stage < inputs.stages(); ++stage) {
    inputs.acquire(stage);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      int const off = stage * K + k;
      if (off >= inputs.tokens) break;
      int64_t const t = t0 + off;
      float xt[V], dyt[V];
      inputs.read(stage, 0, k, xt);
      inputs.read(stage, 1, k, dyt);
      if (off >= off_next) {  // a document starts at t (after any empty ones; t < t1)
        n = docs.of(t);
        bos = docs.start(n);
        eos = docs.start(n + 1);
        enter_document(t);
      }
      float pre[V], g[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        pre[j] = b[j];
#pragma unroll
        for (int i = 0; i < W - 1; ++i) pre[j] = fmaf(w[i][j], halo[i][j], pre[j]);
        pre[j] = fmaf(w[W - 1][j], xt[j], pre[j]);
      }
      // One branch on the activation a token, not one a channel.
      if (silu) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          g[j] = dyt[j] * conv1d::activation_slope(cakeActivationSilu, pre[j]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) g[j] = dyt[j];  // act' = 1
      }
      if (off < off1) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
#pragma unroll
          for (int i = 0; i < W - 1; ++i) dw[i][j] = fmaf(g[j], halo[i][j], dw[i][j]);
          dw[W - 1][j] = fmaf(g[j], xt[j], dw[W - 1][j]);
          db[j] += g[j];
        }
        if (p.dresidual != nullptr && active) {
          conv1d::store_row<T, V>(static_cast<T*>(p.dresidual) + t * p.dim, d, p.dim, p.vectorised,
                                  dyt);
        }
      }
      // dx[s], s = t - m: the sum over taps i >= W - 1 - m of weight[:, i] g[t - u] with
      // u = m - (W - 1) + i (g for u = 0, else ring[W - 1 - u]); at a document's last token (g
      // after it 0) plus dht's column W - 1 - m.
      auto const write_dx = [&](int m, bool last) {
        float out[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          float acc = 0.f;
#pragma unroll
          for (int i = W - 1 - m; i < W; ++i) {
            int const u = m - (W - 1) + i;
            acc = fmaf(w[i][j], u == 0 ? g[j] : ring[W - 1 - u][j], acc);
          }
          if (last && p.dht != nullptr && d + j < p.dim) {
            acc += conv1d::load_small(p.dht, p.dht_dtype, (n * p.dim + d + j) * W + (W - 1 - m));
          }
          out[j] = acc;
        }
        conv1d::store_row<T, V>(static_cast<T*>(p.dx) + (t - m) * p.dim, d, p.dim, p.vectorised,
                                out);
      };
      if (p.dx != nullptr && active) {
        if (off + 1 == off_next) {  // t is its document's last token: every pending dx
#pragma unroll
          for (int m = 0; m < W; ++m) {
            int64_t const s = t - m;
            if (s >= bos && s >= t0 && s < t1) write_dx(m, true);
          }
        } else if (off >= off_out) {  // the one W - 1 tokens back (before t1, as t < t_end)
          write_dx(W - 1, false);
        }
      }
#pragma unroll
      for (int h = 0; h < W - 2; ++h) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          halo[h][j] = halo[h + 1][j];
          ring[h][j] = ring[h + 1][j];
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        halo[W - 2][j] = xt[j];
        ring[W - 2][j] = g[j];
      }
    }
    inputs.release(stage);
  }

#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (d + j >= p.dim) break;
    int64_t const row = tile * p.dim + d + j;
    if (p.dweight_partial != nullptr) {
#pragma unroll
      for (int i = 0; i < W; ++i) p.dweight_partial[row * W + i] = dw[i][j];
    }
    if (p.dbias_partial != nullptr) p.dbias_partial[row] = db[j];
  }
}

// One thread per (document, channel): blockIdx.x is the document.
template <class T, int W>
__global__ void __launch_bounds__(kStateThreads)
    conv1d_state_bwd_kernel(__grid_constant__ Params const p) {
  int const d = static_cast<int>(blockIdx.y) * kStateThreads + static_cast<int>(threadIdx.x);
  int64_t const n = blockIdx.x;
  if (d >= p.dim) return;
  Documents const docs = documents(p);
  int64_t const bos = docs.start(n), len = docs.start(n + 1) - bos;
  T const* x = static_cast<T const*>(p.x);
  T const* dy = static_cast<T const*>(p.dy);
  float w[W][1], b[1];
  conv1d::load_taps<1, W>(p.weight, p.weight_dtype, p.bias, p.bias_dtype, p.dim, d, w, b);
  // acc[c]: the gradient of e[c - W]; final_state's column c - L holds it when c >= L.
  float acc[W];
#pragma unroll
  for (int c = 0; c < W; ++c) {
    acc[c] = p.dht != nullptr && c >= len
                 ? conv1d::load_small(p.dht, p.dht_dtype, (n * p.dim + d) * W + (c - len))
                 : 0.f;
  }
#pragma unroll
  for (int t = 0; t < W - 1; ++t) {
    if (t >= len) break;
    float pre = b[0];
#pragma unroll
    for (int i = 0; i < W; ++i) {
      float const e = conv1d::extended_one<T, W>(x, p.initial_state, p.initial_state_dtype, p.dim,
                                                 n, bos, bos + t - (W - 1) + i, d);
      pre = fmaf(w[i][0], e, pre);
    }
    float const g =
        conv1d::to_float(dy[(bos + t) * p.dim + d]) * conv1d::activation_slope(p.activation, pre);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      int const c = t - (W - 1) + i + W;  // e[t - (W - 1) + i] is column c when c < W
      if (c < W) acc[c] = fmaf(w[i][0], g, acc[c]);
    }
  }
#pragma unroll
  for (int c = 0; c < W; ++c) {
    conv1d::store_small(p.dinitial_state, p.dinitial_state_dtype, (n * p.dim + d) * W + c, acc[c]);
  }
}

// Elements k of dweight [D * W] then dbias [D], 32 a block (lane l: k = 32 blockIdx.x + l). A
// warp's loads run kAhead tiles ahead of its adds, so that they are in flight together.
__global__ void __launch_bounds__(kReduceThreads)
    conv1d_reduce_kernel(__grid_constant__ Params const p) {
  constexpr int kAhead = 4;
  extern __shared__ __align__(16) char smem_raw[];
  auto& part = reinterpret_cast<ReduceShared*>(smem_raw)->part;
  int const lane = static_cast<int>(threadIdx.x) % 32;
  int const warp = static_cast<int>(threadIdx.x) / 32;
  int64_t const k = int64_t{blockIdx.x} * 32 + lane;
  int64_t const taps = int64_t{p.dim} * p.width;
  // The element is wanted (its sum is written, 0 without tiles). Not `src != nullptr`: without
  // tokens the workspace may be NULL (0 bytes), and element 0's src is then NULL too.
  bool wanted = false;
  float const* src = nullptr;  // the element's value in tile 0; tile t's at src[t * stride]
  int64_t stride = 0;
  if (k < taps && p.dweight != nullptr) {
    wanted = true;
    src = p.dweight_partial + k;
    stride = taps;
  } else if (k >= taps && k < taps + p.dim && p.dbias != nullptr) {
    wanted = true;
    src = p.dbias_partial + (k - taps);
    stride = p.dim;
  }
  float acc = 0.f;
  if (wanted) {
    int64_t tile = warp;
    for (; tile + (kAhead - 1) * kReduceWarps < p.num_tiles; tile += kAhead * kReduceWarps) {
      float v[kAhead];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) v[j] = src[(tile + j * kReduceWarps) * stride];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) acc += v[j];
    }
    for (; tile < p.num_tiles; tile += kReduceWarps) acc += src[tile * stride];
  }
  part[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || !wanted) return;
  float sum = part[0][lane];
#pragma unroll
  for (int w = 1; w < kReduceWarps; ++w) sum += part[w][lane];
  if (k < taps) {
    conv1d::store_small(p.dweight, p.dweight_dtype, k, sum);
  } else {
    conv1d::store_small(p.dbias, p.dbias_dtype, k - taps, sum);
  }
}

}  // namespace cake::kernels::conv1d_bwd
