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
// Each thread owns one slot j of a row and a tile of kTileTokens tokens, so that a warp reads 32
// adjacent elements of a row and no thread divides by the row's length. The sums are
// deterministic: gate_bwd_kernel writes each tile's two sums per slot (tokens in order),
// gate_reduce_kernel adds the tiles in order per slot, and gate_head_kernel a value head's W slots
// in order.
// All of it is bound by memory: one read of the raw inputs and one write of the outputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/dtype.cuh"
#include "kernels/gate/params.hpp"

namespace cake::kernels::gate {

inline constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// log(1 + e^x), without overflow for large x or loss for very negative x.
__device__ __forceinline__ float softplus(float x) {
  return fmaxf(x, 0.f) + log1pf(expf(-fabsf(x)));
}

// The elements a thread owns: slot j of rows [t0, t1) of a [BT, slots] tensor.
struct Cell {
  int j;
  int64_t t0, t1;
};

// The thread's cell in tile `tile` (false when its slot lies past the row).
__device__ __forceinline__ bool cell_of(int64_t tile, int slots, int64_t num_tokens, Cell& c) {
  c.j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  c.t0 = tile * kTileTokens;
  c.t1 = c.t0 + kTileTokens < num_tokens ? c.t0 + kTileTokens : num_tokens;
  return c.j < slots;
}

// a = exp(A_log[hv]) and dt_bias[j] of slot j (1 and 0 where absent).
struct SlotConstants {
  float a, bias;
};
__device__ __forceinline__ SlotConstants slot_constants(Params const& p, int j) {
  return {p.A_log != nullptr ? expf(load_small(p.A_log, p.A_log_dtype, j / p.width)) : 1.f,
          p.dt_bias != nullptr ? load_small(p.dt_bias, p.dt_bias_dtype, j) : 0.f};
}

// Runs body(tile, cell) for each of the thread's cells of a [BT, slots] tensor: its slot in
// every tile of the grid's row of tiles (tiles strided by gridDim.y).
template <class Body>
__device__ __forceinline__ void for_each_cell(Params const& p, int slots, Body&& body) {
  for (int64_t tile = blockIdx.y; tile < num_tiles(p.num_tokens); tile += gridDim.y) {
    Cell c;
    if (!cell_of(tile, slots, p.num_tokens, c)) return;
    body(tile, c);
  }
}

// g from g_raw. Grid: elementwise_grid(HV W, BT).
__global__ void __launch_bounds__(kThreads) gate_fwd_kernel(__grid_constant__ Params const p) {
  int const slots = p.num_v_heads * p.width;
  for_each_cell(p, slots, [&](int64_t, Cell const& c) {
    SlotConstants const k = slot_constants(p, c.j);
    for (int64_t t = c.t0; t < c.t1; ++t) {
      int64_t const e = t * slots + c.j;
      float const x = load_small(p.g_raw, p.g_dtype, e) + k.bias;
      p.g[e] = p.has_lower_bound ? p.lower_bound * sigmoid(k.a * x) : -k.a * softplus(x);
    }
  });
}

// beta from beta_raw. Grid: elementwise_grid(HV, BT).
__global__ void __launch_bounds__(kThreads) beta_fwd_kernel(__grid_constant__ Params const p) {
  for_each_cell(p, p.num_v_heads, [&](int64_t, Cell const& c) {
    for (int64_t t = c.t0; t < c.t1; ++t) {
      int64_t const e = t * p.num_v_heads + c.j;
      p.beta[e] = p.beta_c * sigmoid(load_small(p.beta_raw, p.beta_dtype, e));
    }
  });
}

// dg_raw, and each tile's sums of dx and of the A_log terms per slot (partials [tiles, 2, slots]).
// Grid as gate_fwd_kernel's.
__global__ void __launch_bounds__(kThreads) gate_bwd_kernel(__grid_constant__ Params const p) {
  int const slots = p.num_v_heads * p.width;
  for_each_cell(p, slots, [&](int64_t tile, Cell const& c) {
    SlotConstants const k = slot_constants(p, c.j);
    float sum_dx = 0.f, sum_term = 0.f;
    for (int64_t t = c.t0; t < c.t1; ++t) {
      int64_t const e = t * slots + c.j;
      float const x = load_small(p.g_raw, p.g_dtype, e) + k.bias;
      float const dg = p.dg[e];
      float dx, term;
      if (p.has_lower_bound) {
        float const s = sigmoid(k.a * x);
        float const dz = dg * p.lower_bound * s * (1.f - s);
        dx = k.a * dz;
        term = dz * k.a * x;
      } else {
        dx = -k.a * sigmoid(x) * dg;
        term = -k.a * softplus(x) * dg;
      }
      if (p.dg_raw != nullptr) store_small(p.dg_raw, p.g_dtype, e, dx);
      sum_dx += dx;
      sum_term += term;
    }
    if (p.partials != nullptr) {
      p.partials[(tile * 2) * slots + c.j] = sum_dx;
      p.partials[(tile * 2 + 1) * slots + c.j] = sum_term;
    }
  });
}

// ddt_bias from the tiles' sums, one thread per slot j adding the tiles in order; its sum of the
// A_log terms goes to partials[1, j] (tile 0's, which only this thread reads) for
// gate_head_kernel. Grid: slots / kThreads.
__global__ void __launch_bounds__(kThreads) gate_reduce_kernel(__grid_constant__ Params const p) {
  int const slots = p.num_v_heads * p.width;
  int const j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= slots) return;
  int64_t const tiles = num_tiles(p.num_tokens);
  float sum_dx = 0.f, sum_term = 0.f;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    sum_dx += p.partials[(tile * 2) * slots + j];
    sum_term += p.partials[(tile * 2 + 1) * slots + j];
  }
  if (p.ddt_bias != nullptr) store_small(p.ddt_bias, p.dt_bias_dtype, j, sum_dx);
  p.partials[slots + j] = sum_term;
}

// dA_log[hv], one thread per value head adding its W slots' sums in order. Grid: HV / kThreads.
__global__ void __launch_bounds__(kThreads) gate_head_kernel(__grid_constant__ Params const p) {
  int const hv = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (hv >= p.num_v_heads) return;
  int const slots = p.num_v_heads * p.width;
  float total = 0.f;
  for (int c = 0; c < p.width; ++c) total += p.partials[slots + hv * p.width + c];
  store_small(p.dA_log, p.A_log_dtype, hv, total);
}

// dbeta_raw. Grid as beta_fwd_kernel's.
__global__ void __launch_bounds__(kThreads) beta_bwd_kernel(__grid_constant__ Params const p) {
  for_each_cell(p, p.num_v_heads, [&](int64_t, Cell const& c) {
    for (int64_t t = c.t0; t < c.t1; ++t) {
      int64_t const e = t * p.num_v_heads + c.j;
      float const s = sigmoid(load_small(p.beta_raw, p.beta_dtype, e));
      store_small(p.dbeta_raw, p.beta_dtype, e, p.beta_c * s * (1.f - s) * p.dbeta[e]);
    }
  });
}

// Blocks of kThreads for n threads.
inline unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// The grid of the elementwise kernels for rows of `slots` elements: the tiles beyond 65,535 are
// taken by the same blocks in turn.
struct Grid {
  unsigned x, y;
};
inline Grid elementwise_grid(int slots, int64_t num_tokens) {
  int64_t const tiles = num_tiles(num_tokens);
  return {blocks(slots), static_cast<unsigned>(tiles < 65535 ? tiles : 65535)};
}

// What the backward runs.
inline bool wants_gate_bwd(Params const& p) {
  return p.activate_g && (p.dg_raw != nullptr || p.partials != nullptr);
}
inline bool wants_reduce(Params const& p) {
  return p.activate_g && p.partials != nullptr && (p.dA_log != nullptr || p.ddt_bias != nullptr);
}
inline bool wants_beta_bwd(Params const& p) { return p.activate_beta && p.dbeta_raw != nullptr; }

}  // namespace cake::kernels::gate
