// Stage 3: W = T diag(beta) (K * e^G), U = T diag(beta) V (chunk_wy.hpp).
#include "ref/chunk_wy.hpp"

namespace cake::ref {

void chunk_wy_forward(Shape const& shape, ChunkTiling const& tiling, double const* k,
                      double const* v, double const* beta, double const* G, double const* A,
                      double* w, double* u) {
  Layout const ix(shape, tiling.chunk_size);
  for_each_chunk(shape, tiling, [&](Chunk const& c) {
    for (int64_t i = 0; i < c.size; ++i) {
      double const* T_i = A + ix.row(c.begin + i, c.hv);
      double* w_i = w + ix.key(c.begin + i, c.hv);
      double* u_i = u + ix.val(c.begin + i, c.hv);
      for (int64_t d = 0; d < ix.K; ++d) w_i[d] = 0;
      for (int64_t e = 0; e < ix.V; ++e) u_i[e] = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double const coef = T_i[j] * beta[ix.head(c.begin + j, c.hv)];
        double const* k_j = k + ix.qk(c.begin + j, c.h);
        double const* G_j = G + ix.gate(c.begin + j, c.hv);
        double const* v_j = v + ix.val(c.begin + j, c.hv);
        for (int64_t d = 0; d < ix.K; ++d)
          w_i[d] += coef * k_j[d] * std::exp(G_j[d * ix.gate_stride]);
        for (int64_t e = 0; e < ix.V; ++e) u_i[e] += coef * v_j[e];
      }
    }
  });
}

}  // namespace cake::ref
