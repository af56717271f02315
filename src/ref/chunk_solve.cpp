// Stage 2: L = strictly-lower beta-weighted gated K K^T, T = (I + L)^-1 (chunk_solve.hpp).
#include "ref/chunk_solve.hpp"

namespace cake::ref {

void chunk_solve_forward(Shape const& shape, ChunkTiling const& tiling, double const* k,
                         double const* beta, double const* G, double* A) {
  Layout const ix(shape, tiling.chunk_size);
  for_each_chunk(shape, tiling, [&](Chunk const& c) {
    int64_t const n = c.size;
    std::vector<double> L(n * n, 0.0);  // row-major n x n
    for (int64_t i = 0; i < n; ++i) {
      double const* k_i = k + ix.qk(c.begin + i, c.h);
      double const* G_i = G + ix.gate(c.begin + i, c.hv);
      for (int64_t j = 0; j < i; ++j) {
        double const* k_j = k + ix.qk(c.begin + j, c.h);
        double const* G_j = G + ix.gate(c.begin + j, c.hv);
        double dot = 0;
        for (int64_t d = 0; d < ix.K; ++d)
          dot += k_i[d] * k_j[d] * decay_pair(G_i, G_j, d, ix.gate_stride);
        L[i * n + j] = beta[ix.head(c.begin + i, c.hv)] * dot;
      }
    }
    // Forward substitution: (I + L) T = I, so row i of T only needs rows m < i.
    for (int64_t i = 0; i < n; ++i) {
      double* T_i = A + ix.row(c.begin + i, c.hv);
      for (int64_t j = 0; j < ix.C; ++j) T_i[j] = (j == i) ? 1.0 : 0.0;
      for (int64_t m = 0; m < i; ++m) {
        double const* T_m = A + ix.row(c.begin + m, c.hv);
        for (int64_t j = 0; j <= m; ++j) T_i[j] -= L[i * n + m] * T_m[j];
      }
    }
  });
}

}  // namespace cake::ref
