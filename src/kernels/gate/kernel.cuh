// The op's in-kernel activations of g and beta (use_gate_in_kernel, use_beta_sigmoid_in_kernel),
// forward and backward, elementwise in FP32 from the caller's dtypes. Per element of g
// [BT, HV, W] (W = 1 for GDN, K for KDA), its slot j in a token's row of HV W and its value head
// hv = j / W, with x = g_raw + dt_bias[j] and a = exp(A_log[hv]):
//
//   softplus form:     g = -a softplus(x)
//                      dx = -a sigmoid(x) dg                       A_log term = g dg
//   lower-bound form:  g = lower_bound s,  s = sigmoid(a x)
//                      dz = lower_bound s (1 - s) dg,  dx = a dz   A_log term = dz a x
//   dg_raw = dx,  ddt_bias[j] = sum over tokens of dx,  dA_log[hv] = sum over tokens and W of the
//   A_log terms;  and per element of beta [BT, HV]: beta = c sigmoid(beta_raw),
//   dbeta_raw = c s (1 - s) dbeta with s = sigmoid(beta_raw).
//
// All of it is bound by memory (one read of the raw inputs, one write of the outputs), and rows
// are short (HV = 48 slots of GDN's g and of beta at 48 value heads): so no thread walks a long
// run of tokens one load at a time. The elementwise kernels take the tensor flat, kUnroll elements
// a thread with their loads issued first. The backward's sums are deterministic: a warp owns 32
// adjacent slots of a tile of tile_tokens(slots) tokens and adds them in token order
// (gate_bwd_kernel, partials [tiles, 2, slots]); gate_reduce_kernel adds a slot's tiles with its
// block's 32 warps each taking every 32nd tile in order, then the warps' sums in warp order;
// gate_head_kernel a value head's W slots in order. Every order depends on the shapes alone.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/dtype.cuh"
#include "kernels/common/sigmoid.cuh"
#include "kernels/gate/params.hpp"

namespace cake::kernels::gate {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
// Elements (or tokens) a thread loads before it computes any of them.
inline constexpr int kUnroll = 4;
// gate_reduce_kernel's block: 32 warps, so that a slot's thousands of tiles (at hundreds of
// thousands of tokens) are a short walk for each.
inline constexpr int kReduceThreads = 1024;
inline constexpr int kReduceWarps = kReduceThreads / 32;

// log(1 + e^x), without overflow for large x or loss for very negative x.
__device__ __forceinline__ float softplus(float x) {
  return fmaxf(x, 0.f) + log1pf(expf(-fabsf(x)));
}

// a = exp(A_log[hv]) and dt_bias[j] of slot j (1 and 0 where absent).
struct SlotConstants {
  float a, bias;
};
__device__ __forceinline__ SlotConstants slot_constants(Params const& p, int j) {
  return {p.A_log != nullptr ? expf(load_small(p.A_log, p.A_log_dtype, j / p.width)) : 1.f,
          p.dt_bias != nullptr ? load_small(p.dt_bias, p.dt_bias_dtype, j) : 0.f};
}

// Runs out(e, load(e)) for every element e < n of a flat tensor: each thread kUnroll elements
// kThreads apart (a warp's loads adjacent), all kUnroll loads before the first out, grid-strided.
template <class Load, class Out>
__device__ __forceinline__ void for_each_element(int64_t n, Load&& load, Out&& out) {
  int64_t const per_block = int64_t{kThreads} * kUnroll;
  for (int64_t base = blockIdx.x * per_block + threadIdx.x; base < n;
       base += int64_t{gridDim.x} * per_block) {
    decltype(load(base)) in[kUnroll] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t const e = base + int64_t{u} * kThreads;
      if (e < n) in[u] = load(e);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t const e = base + int64_t{u} * kThreads;
      if (e < n) out(e, in[u]);
    }
  }
}

// g from g_raw. Grid: flat_grid(BT HV W).
__global__ void __launch_bounds__(kThreads) gate_fwd_kernel(__grid_constant__ Params const p) {
  int const slots = p.num_v_heads * p.width;
  for_each_element(
      p.num_tokens * slots, [&](int64_t e) { return load_small(p.g_raw, p.g_dtype, e); },
      [&](int64_t e, float raw) {
        SlotConstants const k = slot_constants(p, static_cast<int>(e % slots));
        float const x = raw + k.bias;
        p.g[e] = p.has_lower_bound ? p.lower_bound * sigmoid_exact(k.a * x) : -k.a * softplus(x);
      });
}

// beta from beta_raw. Grid: flat_grid(BT HV).
__global__ void __launch_bounds__(kThreads) beta_fwd_kernel(__grid_constant__ Params const p) {
  for_each_element(
      p.num_tokens * p.num_v_heads,
      [&](int64_t e) { return load_small(p.beta_raw, p.beta_dtype, e); },
      [&](int64_t e, float raw) { p.beta[e] = p.beta_c * sigmoid_exact(raw); });
}

// dbeta_raw. Grid: flat_grid(BT HV).
__global__ void __launch_bounds__(kThreads) beta_bwd_kernel(__grid_constant__ Params const p) {
  struct In {
    float raw, dbeta;
  };
  for_each_element(
      p.num_tokens * p.num_v_heads,
      [&](int64_t e) {
        return In{load_small(p.beta_raw, p.beta_dtype, e), p.dbeta[e]};
      },
      [&](int64_t e, In in) {
        store_small(p.dbeta_raw, p.beta_dtype, e,
                    p.beta_c * sigmoid_slope_exact(in.raw) * in.dbeta);
      });
}

// dg_raw, and each tile's sums of dx and of the A_log terms per slot (partials [tiles, 2, slots]).
// Warp w of block (x, y) owns slots 32 x .. 32 x + 31 of tiles y kWarps + w, then every
// gridDim.y kWarps-th tile after it. Grid: tile_grid(HV W, BT).
__global__ void __launch_bounds__(kThreads) gate_bwd_kernel(__grid_constant__ Params const p) {
  int const slots = p.num_v_heads * p.width;
  int const j = static_cast<int>(blockIdx.x * 32 + threadIdx.x % 32);
  if (j >= slots) return;  // the kernel has no barrier or warp collective
  SlotConstants const k = slot_constants(p, j);
  int64_t const tiles = num_tiles(p.num_tokens, slots), tile_size = tile_tokens(slots);
  for (int64_t tile = int64_t{blockIdx.y} * kWarps + threadIdx.x / 32; tile < tiles;
       tile += int64_t{gridDim.y} * kWarps) {
    int64_t const t0 = tile * tile_size;
    int64_t const t1 = t0 + tile_size < p.num_tokens ? t0 + tile_size : p.num_tokens;
    float sum_dx = 0.f, sum_term = 0.f;
    for (int64_t t = t0; t < t1; t += kUnroll) {
      float x[kUnroll] = {}, dg[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (t + u < t1) {
          int64_t const e = (t + u) * slots + j;
          x[u] = load_small(p.g_raw, p.g_dtype, e) + k.bias;
          dg[u] = p.dg[e];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (t + u >= t1) break;
        float dx, term;
        if (p.has_lower_bound) {
          float const dz = dg[u] * p.lower_bound * sigmoid_slope_exact(k.a * x[u]);
          dx = k.a * dz;
          term = dz * k.a * x[u];
        } else {
          dx = -k.a * sigmoid_exact(x[u]) * dg[u];
          term = -k.a * softplus(x[u]) * dg[u];
        }
        if (p.dg_raw != nullptr) store_small(p.dg_raw, p.g_dtype, (t + u) * slots + j, dx);
        sum_dx += dx;
        sum_term += term;
      }
    }
    if (p.partials != nullptr) {
      p.partials[(tile * 2) * slots + j] = sum_dx;
      p.partials[(tile * 2 + 1) * slots + j] = sum_term;
    }
  }
}

// The warps' sums of gate_reduce_kernel, per warp and lane.
struct ReduceShared {
  float dx[kReduceWarps][32];
  float term[kReduceWarps][32];
};

// ddt_bias from the tiles' sums for slots 32 x .. 32 x + 31 of block x: warp w adds tiles w,
// w + kReduceWarps, ... in order, then warp 0 the warps' sums in order. The slot's sum of the A_log
// terms goes to partials[1, j] (tile 0's, which only this block reads, and only before the
// barrier) for gate_head_kernel. Grid: reduce_blocks(HV W).
__global__ void __launch_bounds__(kReduceThreads)
    gate_reduce_kernel(__grid_constant__ Params const p) {
  extern __shared__ __align__(16) char smem_raw[];
  ReduceShared& sums = *reinterpret_cast<ReduceShared*>(smem_raw);
  int const slots = p.num_v_heads * p.width;
  int const lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  int const j = static_cast<int>(blockIdx.x * 32) + lane;
  int64_t const tiles = num_tiles(p.num_tokens, slots);
  float sum_dx = 0.f, sum_term = 0.f;
  if (j < slots) {
    for (int64_t tile = warp; tile < tiles; tile += int64_t{kReduceWarps} * kUnroll) {
      float dx[kUnroll] = {}, term[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        int64_t const i = tile + int64_t{u} * kReduceWarps;
        if (i < tiles) {
          dx[u] = p.partials[(i * 2) * slots + j];
          term[u] = p.partials[(i * 2 + 1) * slots + j];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        sum_dx += dx[u];
        sum_term += term[u];
      }
    }
  }
  sums.dx[warp][lane] = sum_dx;
  sums.term[warp][lane] = sum_term;
  __syncthreads();
  if (warp != 0 || j >= slots) return;
  float total_dx = 0.f, total_term = 0.f;
  for (int w = 0; w < kReduceWarps; ++w) {
    total_dx += sums.dx[w][lane];
    total_term += sums.term[w][lane];
  }
  if (p.ddt_bias != nullptr) store_small(p.ddt_bias, p.dt_bias_dtype, j, total_dx);
  p.partials[slots + j] = total_term;
}

// dA_log[hv], one thread per value head adding its W slots' sums in order. Grid: blocks(HV).
__global__ void __launch_bounds__(kThreads) gate_head_kernel(__grid_constant__ Params const p) {
  int const hv = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (hv >= p.num_v_heads) return;
  int const slots = p.num_v_heads * p.width;
  float total = 0.f;
  for (int c = 0; c < p.width; ++c) total += p.partials[slots + hv * p.width + c];
  store_small(p.dA_log, p.A_log_dtype, hv, total);
}

// Blocks of kThreads for n threads.
inline unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// The elementwise kernels' grid for n elements (beyond 2^24 blocks the blocks stride).
inline unsigned flat_grid(int64_t n) {
  int64_t const b = (n + int64_t{kThreads} * kUnroll - 1) / (int64_t{kThreads} * kUnroll);
  return static_cast<unsigned>(b < (int64_t{1} << 24) ? b : int64_t{1} << 24);
}

// gate_bwd_kernel's grid for rows of `slots` elements: x over groups of 32 slots, y over groups
// of kWarps tiles (beyond 65,535 the blocks stride).
struct Grid {
  unsigned x, y;
};
inline Grid tile_grid(int slots, int64_t num_tokens) {
  int64_t const groups = (num_tiles(num_tokens, slots) + kWarps - 1) / kWarps;
  return {static_cast<unsigned>((slots + 31) / 32),
          static_cast<unsigned>(groups < 65535 ? groups : 65535)};
}

// gate_reduce_kernel's grid: a block per 32 slots.
inline unsigned reduce_blocks(int slots) { return static_cast<unsigned>((slots + 31) / 32); }

// What the backward runs.
inline bool wants_gate_bwd(Params const& p) {
  return p.activate_g && (p.dg_raw != nullptr || p.partials != nullptr);
}
inline bool wants_reduce(Params const& p) {
  return p.activate_g && p.partials != nullptr && (p.dA_log != nullptr || p.ddt_bias != nullptr);
}
inline bool wants_beta_bwd(Params const& p) { return p.activate_beta && p.dbeta_raw != nullptr; }

}  // namespace cake::kernels::gate
