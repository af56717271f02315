// The norm's backward (src/ref/norm.hpp has the maths), per row, with n = x rstd, a = act(g) and
// dn = dy weight a:
//   dx = rstd (dn - n mean(dn n)),   dg = dy n weight act'(g),   dweight = sum_rows dy n a
// norm_bwd_kernel: the rows spread over lanes as in the forward (norm_rows.hpp); a row's lanes
// load x, dy and g (16-byte vectors, issued before any arithmetic), write dg, sum dn n over the
// row by shuffles and write dx. Each lane adds dy n a of its columns over the rows it visits;
// at the end the block sums them in a fixed order (across a warp's rows by a shuffle butterfly,
// then the warps in order through shared memory) into its row of the workspace.
// norm_reduce_kernel: dweight, each column the sum of the blocks' rows in a fixed order (slices
// of blocks in order, then the slices in order): bitwise reproducible.
#pragma once

#include "kernels/common/norm.cuh"
#include "kernels/norm_bwd/params.hpp"

namespace cake::kernels::norm_bwd {

using norm::kThreads;
using norm::kWarps;
inline constexpr int kReduceColumns = 32;
inline constexpr int kReduceSlices = 16;
inline constexpr int kReduceThreads = kReduceColumns * kReduceSlices;

// Dynamic shared memory: the staged weight float [N], then the warps' dweight sums [kWarps, N].
inline unsigned smem_bytes(Params const& p) {
  return static_cast<unsigned>(p.dim) * 4u * (1u + kWarps);
}

// The reduce's dynamic shared memory: the slices' sums, float [kReduceSlices, kReduceColumns].
inline constexpr unsigned kReduceSmemBytes = kReduceThreads * 4u;

inline unsigned reduce_blocks(Params const& p) {
  return static_cast<unsigned>((p.dim + kReduceColumns - 1) / kReduceColumns);
}

template <class T, int S>
__global__ void __launch_bounds__(kThreads) norm_bwd_kernel(__grid_constant__ Params const p) {
  constexpr int V = norm::kVec<T>;
  extern __shared__ __align__(16) char smem_raw[];
  float* weight = reinterpret_cast<float*>(smem_raw);
  float* warp_sums = weight + p.dim;
  norm::stage_weight(p.weight, p.weight_dtype, p.dim, weight);

  int const lanes = p.layout.lanes, vectors = p.dim / V;
  int const lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  int const part = lane % lanes;
  int const rows_per_block = kThreads / lanes;
  int const group = static_cast<int>(threadIdx.x) / lanes;
  T const* x = static_cast<T const*>(p.x);
  T const* g = static_cast<T const*>(p.g);
  T const* dy = static_cast<T const*>(p.dy);
  float const inv_dim = 1.f / static_cast<float>(p.dim);
  float dweight[S][V] = {};  // this lane's columns, over its rows

  for (int64_t first = int64_t{blockIdx.x} * rows_per_block; first < p.rows;
       first += int64_t{gridDim.x} * rows_per_block) {
    int64_t const row = first + group;
    bool const valid = row < p.rows;
    float n[S][V], dys[S][V], gs[S][V];
#pragma unroll
    for (int s = 0; s < S; ++s) {
      int const v = part + lanes * s;
      bool const here = valid && v < vectors;
      int64_t const at = row * p.dim + v * V;
      norm::load_vector(x + at, here, n[s]);
      norm::load_vector(dy + at, here, dys[s]);
      if (g != nullptr) norm::load_vector(g + at, here, gs[s]);
    }
    float const rstd = valid ? p.rstd[row] : 0.f;
    // n, then dn in place of dy; dn n summed over the row.
    float dn_dot_n = 0.f;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      int const v = part + lanes * s;
      float dg[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float const w = weight[(v < vectors ? v : 0) * V + j];
        float const a = g != nullptr ? norm::gate(p.activation, gs[s][j]) : 1.f;
        n[s][j] *= rstd;
        float const dy_n = dys[s][j] * n[s][j];
        dweight[s][j] = fmaf(dy_n, a, dweight[s][j]);
        if (g != nullptr) dg[j] = dy_n * w * norm::gate_slope(p.activation, gs[s][j]);
        dys[s][j] *= w * a;
        dn_dot_n = fmaf(dys[s][j], n[s][j], dn_dot_n);
      }
      if (p.dg != nullptr && valid && v < vectors) {
        norm::store_vector(static_cast<T*>(p.dg) + row * p.dim + v * V, dg);
      }
    }
    float const mean_dn_n = norm::row_sum(dn_dot_n, lanes) * inv_dim;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      int const v = part + lanes * s;
      if (p.dx == nullptr || !valid || v >= vectors) continue;
      float out[V];
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = rstd * fmaf(-n[s][j], mean_dn_n, dys[s][j]);
      norm::store_vector(static_cast<T*>(p.dx) + row * p.dim + v * V, out);
    }
  }

  if (p.dweight_partial == nullptr) return;
    // The warp's rows share columns: lanes l, l ^ lanes, ... hold the same ones.
#pragma unroll
  for (int s = 0; s < S; ++s) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      for (int offset = lanes; offset < 32; offset *= 2) {
        dweight[s][j] += __shfl_xor_sync(0xffffffffu, dweight[s][j], offset);
      }
    }
  }
  if (lane < lanes) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      int const v = part + lanes * s;
      if (v >= vectors) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) warp_sums[warp * p.dim + v * V + j] = dweight[s][j];
    }
  }
  __syncthreads();
  for (int c = static_cast<int>(threadIdx.x); c < p.dim; c += kThreads) {
    float sum = warp_sums[c];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum += warp_sums[w * p.dim + c];
    p.dweight_partial[int64_t{blockIdx.x} * p.dim + c] = sum;
  }
}

// dweight: block x covers kReduceColumns columns; thread (slice, column) sums the rows of blocks
// slice, slice + kReduceSlices, ... in order, then slice 0 sums the slices in order.
__global__ void __launch_bounds__(kReduceThreads)
    norm_reduce_kernel(__grid_constant__ Params const p) {
  extern __shared__ __align__(16) char smem_raw[];
  auto& slices = *reinterpret_cast<float(*)[kReduceSlices][kReduceColumns]>(smem_raw);
  int const column = static_cast<int>(threadIdx.x) % kReduceColumns;
  int const slice = static_cast<int>(threadIdx.x) / kReduceColumns;
  int const c = static_cast<int>(blockIdx.x) * kReduceColumns + column;
  float sum = 0.f;
  if (c < p.dim) {
    for (int64_t b = slice; b < p.layout.num_blocks; b += kReduceSlices) {
      sum += p.dweight_partial[b * p.dim + c];
    }
  }
  slices[slice][column] = sum;
  __syncthreads();
  if (slice != 0 || c >= p.dim) return;
  float total = slices[0][column];
#pragma unroll
  for (int k = 1; k < kReduceSlices; ++k) total += slices[k][column];
  store_small(p.dweight, p.dweight_dtype, c, total);
}

}  // namespace cake::kernels::norm_bwd
