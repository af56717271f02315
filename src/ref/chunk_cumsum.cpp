// Stage 1 and its adjoint: chunk-local inclusive cumsums of the gate (chunk_cumsum.hpp).
#include "ref/chunk_cumsum.hpp"

namespace cake::ref {

void chunk_local_cumsum(Shape const& shape, ChunkTiling const& tiling, double const* g, double* G) {
  Layout const ix(shape, tiling.chunk_size);
  for_each_chunk(shape, tiling, [&](Chunk const& c) {
    for (int64_t d = 0; d < ix.gate_width; ++d) {
      double sum = 0;
      for (int64_t t = c.begin; t <= c.last(); ++t) {
        sum += g[ix.gate(t, c.hv) + d];
        G[ix.gate(t, c.hv) + d] = sum;
      }
    }
  });
}

void chunk_local_reverse_cumsum(Shape const& shape, ChunkTiling const& tiling, double const* dG,
                                double* dg) {
  Layout const ix(shape, tiling.chunk_size);
  for_each_chunk(shape, tiling, [&](Chunk const& c) {
    for (int64_t d = 0; d < ix.gate_width; ++d) {
      double sum = 0;
      for (int64_t t = c.last(); t >= c.begin; --t) {
        sum += dG[ix.gate(t, c.hv) + d];
        dg[ix.gate(t, c.hv) + d] = sum;
      }
    }
  });
}

}  // namespace cake::ref
