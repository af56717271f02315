// Stage 5: o = scale (Q e^G) h + causal(Aqk) Delta, and dDelta_intra = Aqk^T dO (chunk_output.hpp).
#include "ref/chunk_output.hpp"

namespace cake::ref {
namespace {

// Aqk of one chunk, n x n row-major, zero above the diagonal.
std::vector<double> chunk_qk(Layout const& ix, Chunk const& c, double scale, double const* q,
                             double const* k, double const* G) {
  int64_t const n = c.size;
  std::vector<double> Aqk(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double const* q_i = q + ix.qk(c.begin + i, c.h);
    double const* G_i = G + ix.gate(c.begin + i, c.hv);
    for (int64_t j = 0; j <= i; ++j) {
      double const* k_j = k + ix.qk(c.begin + j, c.h);
      double const* G_j = G + ix.gate(c.begin + j, c.hv);
      double dot = 0;
      for (int64_t d = 0; d < ix.K; ++d)
        dot += q_i[d] * k_j[d] * decay_pair(G_i, G_j, d, ix.gate_stride);
      Aqk[i * n + j] = scale * dot;
    }
  }
  return Aqk;
}

}  // namespace

void chunk_output_forward(Shape const& shape, ChunkTiling const& tiling, double scale,
                          double const* q, double const* k, double const* G, double const* h,
                          double const* v_new, double* o) {
  Layout const ix(shape, tiling.chunk_size);
  for_each_chunk(shape, tiling, [&](Chunk const& c) {
    std::vector<double> const Aqk = chunk_qk(ix, c, scale, q, k, G);
    double const* h_c = h + ix.state(c.slot, c.hv);
    for (int64_t i = 0; i < c.size; ++i) {
      double const* q_i = q + ix.qk(c.begin + i, c.h);
      double const* G_i = G + ix.gate(c.begin + i, c.hv);
      double* o_i = o + ix.val(c.begin + i, c.hv);
      for (int64_t e = 0; e < ix.V; ++e) o_i[e] = 0;
      for (int64_t d = 0; d < ix.K; ++d) {
        double const qe = scale * q_i[d] * std::exp(G_i[d * ix.gate_stride]);
        for (int64_t e = 0; e < ix.V; ++e) o_i[e] += qe * h_c[d * ix.V + e];
      }
      for (int64_t j = 0; j <= i; ++j) {
        double const* delta_j = v_new + ix.val(c.begin + j, c.hv);
        for (int64_t e = 0; e < ix.V; ++e) o_i[e] += Aqk[i * c.size + j] * delta_j[e];
      }
    }
  });
}

void chunk_output_backward_dv(Shape const& shape, ChunkTiling const& tiling, double scale,
                              double const* q, double const* k, double const* G, double const* d_o,
                              double* dv_new_intra) {
  Layout const ix(shape, tiling.chunk_size);
  for_each_chunk(shape, tiling, [&](Chunk const& c) {
    std::vector<double> const Aqk = chunk_qk(ix, c, scale, q, k, G);
    for (int64_t j = 0; j < c.size; ++j) {
      double* dd_j = dv_new_intra + ix.val(c.begin + j, c.hv);
      for (int64_t e = 0; e < ix.V; ++e) dd_j[e] = 0;
      for (int64_t i = j; i < c.size; ++i) {
        double const* do_i = d_o + ix.val(c.begin + i, c.hv);
        for (int64_t e = 0; e < ix.V; ++e) dd_j[e] += Aqk[i * c.size + j] * do_i[e];
      }
    }
  });
}

}  // namespace cake::ref
