// Stage 4: the forward state walk and the reverse state-gradient walk (chunk_state.hpp).
#include "ref/chunk_state.hpp"

#include <algorithm>

namespace cake::ref {

void chunk_state_forward(Shape const& shape, ChunkTiling const& tiling, double const* k,
                         double const* G, double const* w, double const* u, double const* h0,
                         double* h, double* v_new, double* ht) {
  Layout const ix(shape, tiling.chunk_size);
  int64_t const K = ix.K, V = ix.V;
  for_each_seq_head(tiling, ix.HV, [&](int64_t n, int64_t hv) {
    std::vector<double> S(K * V, 0.0);  // the running state, [K, V]
    if (h0) std::copy_n(h0 + ix.state(n, hv), K * V, S.begin());
    for (int64_t cc = 0; cc < tiling.num_chunks(n); ++cc) {
      Chunk const c = tiling.chunk(n, cc, hv, shape.group_size());
      std::copy(S.begin(), S.end(), h + ix.state(c.slot, hv));
      for (int64_t i = 0; i < c.size; ++i) {
        double const* w_i = w + ix.key(c.begin + i, hv);
        double const* u_i = u + ix.val(c.begin + i, hv);
        double* delta_i = v_new + ix.val(c.begin + i, hv);
        for (int64_t e = 0; e < V; ++e) {
          double sum = u_i[e];
          for (int64_t d = 0; d < K; ++d) sum -= w_i[d] * S[d * V + e];
          delta_i[e] = sum;
        }
      }
      double const* G_last = G + ix.gate(c.last(), hv);
      for (int64_t d = 0; d < K; ++d) {
        double const gamma = std::exp(G_last[d * ix.gate_stride]);
        for (int64_t e = 0; e < V; ++e) S[d * V + e] *= gamma;
      }
      for (int64_t i = 0; i < c.size; ++i) {
        double const* k_i = k + ix.qk(c.begin + i, c.h);
        double const* G_i = G + ix.gate(c.begin + i, hv);
        double const* delta_i = v_new + ix.val(c.begin + i, hv);
        for (int64_t d = 0; d < K; ++d) {
          double const kbar = k_i[d] * decay_pair(G_last, G_i, d, ix.gate_stride);
          for (int64_t e = 0; e < V; ++e) S[d * V + e] += kbar * delta_i[e];
        }
      }
    }
    if (ht) std::copy(S.begin(), S.end(), ht + ix.state(n, hv));
  });
}

void chunk_state_backward(Shape const& shape, ChunkTiling const& tiling, double scale,
                          double const* q, double const* k, double const* G, double const* w,
                          double const* d_o, double const* dv_new_intra, double const* dht,
                          double* dh, double* dv_new, double* dh0) {
  Layout const ix(shape, tiling.chunk_size);
  int64_t const K = ix.K, V = ix.V;
  for_each_seq_head(tiling, ix.HV, [&](int64_t n, int64_t hv) {
    std::vector<double> dS(K * V, 0.0);  // gradient of the state at the current chunk's end
    if (dht) std::copy_n(dht + ix.state(n, hv), K * V, dS.begin());
    for (int64_t cc = tiling.num_chunks(n) - 1; cc >= 0; --cc) {
      Chunk const c = tiling.chunk(n, cc, hv, shape.group_size());
      std::copy(dS.begin(), dS.end(), dh + ix.state(c.slot, hv));
      double const* G_last = G + ix.gate(c.last(), hv);
      // dDelta = dDelta_intra + (K * ebar) dS: Delta reaches the end state through K * ebar.
      for (int64_t i = 0; i < c.size; ++i) {
        double const* k_i = k + ix.qk(c.begin + i, c.h);
        double const* G_i = G + ix.gate(c.begin + i, hv);
        double const* intra_i = dv_new_intra + ix.val(c.begin + i, hv);
        double* ddelta_i = dv_new + ix.val(c.begin + i, hv);
        std::copy_n(intra_i, V, ddelta_i);
        for (int64_t d = 0; d < K; ++d) {
          double const kbar = k_i[d] * decay_pair(G_last, G_i, d, ix.gate_stride);
          for (int64_t e = 0; e < V; ++e) ddelta_i[e] += kbar * dS[d * V + e];
        }
      }
      // The start state h reaches the end state (gamma), the outputs (scale Q e^G) and Delta (-W).
      for (int64_t d = 0; d < K; ++d) {
        double const gamma = std::exp(G_last[d * ix.gate_stride]);
        for (int64_t e = 0; e < V; ++e) dS[d * V + e] *= gamma;
      }
      for (int64_t i = 0; i < c.size; ++i) {
        double const* q_i = q + ix.qk(c.begin + i, c.h);
        double const* G_i = G + ix.gate(c.begin + i, hv);
        double const* w_i = w + ix.key(c.begin + i, hv);
        double const* do_i = d_o + ix.val(c.begin + i, hv);
        double const* ddelta_i = dv_new + ix.val(c.begin + i, hv);
        for (int64_t d = 0; d < K; ++d) {
          double const qe = scale * q_i[d] * std::exp(G_i[d * ix.gate_stride]);
          for (int64_t e = 0; e < V; ++e) dS[d * V + e] += qe * do_i[e] - w_i[d] * ddelta_i[e];
        }
      }
    }
    if (dh0) std::copy(dS.begin(), dS.end(), dh0 + ix.state(n, hv));
  });
}

}  // namespace cake::ref
