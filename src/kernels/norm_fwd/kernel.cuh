// The norm's forward (src/ref/norm.hpp has the maths), per row of N values:
//   rstd = 1 / sqrt(mean(x^2) + eps),   y = x rstd weight act(g)
// norm_fwd_kernel: the rows spread over lanes as norm_rows.hpp says; a row's lanes load their x
// and g vectors (16 bytes each, all issued before any arithmetic), sum the squares over the row
// by shuffles, and write y in x's dtype and rstd in float32. The weight is read once per block
// into shared memory.
#pragma once

#include "kernels/common/norm.cuh"
#include "kernels/norm_fwd/params.hpp"

namespace cake::kernels::norm_fwd {

using norm::kThreads;

// Dynamic shared memory: the staged weight, float [N].
inline unsigned smem_bytes(Params const& p) { return static_cast<unsigned>(p.dim) * 4u; }

template <class T, int S>
__global__ void __launch_bounds__(kThreads) norm_fwd_kernel(__grid_constant__ Params const p) {
  constexpr int V = norm::kVec<T>;
  extern __shared__ __align__(16) char smem_raw[];
  float* weight = reinterpret_cast<float*>(smem_raw);
  norm::stage_weight(p.weight, p.weight_dtype, p.dim, weight);

  int const lanes = p.layout.lanes, vectors = p.dim / V;
  int const part = static_cast<int>(threadIdx.x) % lanes;  // this lane's place in its row
  int const rows_per_block = kThreads / lanes;
  int const group = static_cast<int>(threadIdx.x) / lanes;  // its row in the block's step
  T const* x = static_cast<T const*>(p.x);
  T const* g = static_cast<T const*>(p.g);
  T* y = static_cast<T*>(p.y);
  float const inv_dim = 1.f / static_cast<float>(p.dim);

  // The block's steps are the same for all its lanes: the shuffles see whole warps.
  for (int64_t first = int64_t{blockIdx.x} * rows_per_block; first < p.rows;
       first += int64_t{gridDim.x} * rows_per_block) {
    int64_t const row = first + group;
    bool const valid = row < p.rows;
    float xs[S][V], gs[S][V];
    float sum_squares = 0.f;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      int const v = part + lanes * s;
      bool const here = valid && v < vectors;
      int64_t const at = row * p.dim + v * V;
      norm::load_vector(x + at, here, xs[s]);
      if (g != nullptr) norm::load_vector(g + at, here, gs[s]);
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
#pragma unroll
      for (int j = 0; j < V; ++j) sum_squares = fmaf(xs[s][j], xs[s][j], sum_squares);
    }
    float const rstd = rsqrtf(norm::row_sum(sum_squares, lanes) * inv_dim + p.eps);
    if (valid && part == 0) p.rstd[row] = rstd;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      int const v = part + lanes * s;
      if (!valid || v >= vectors) continue;
      float out[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        out[j] = xs[s][j] * rstd * weight[v * V + j];
        if (g != nullptr) out[j] *= norm::gate(p.activation, gs[s][j]);
      }
      norm::store_vector(y + row * p.dim + v * V, out);
    }
  }
}

}  // namespace cake::kernels::norm_fwd
