// Backward stage 6: dq, dk, dw and dG through the output and the chunk-end state (chunk_dqkw.hpp).
#include "ref/chunk_dqkw.hpp"

namespace cake::ref {

void chunk_dqkw(Shape const& shape, ChunkTiling const& tiling, double scale, double const* q,
                double const* k, double const* G, double const* h, double const* v_new,
                double const* d_o, double const* dh, double const* dv_new, double* dq, double* dk,
                double* dw, double* dG) {
  Layout const ix(shape, tiling.chunk_size);
  int64_t const K = ix.K, V = ix.V;
  for_each_chunk(shape, tiling, [&](Chunk const& c) {
    int64_t const n = c.size;
    double const* h_c = h + ix.state(c.slot, c.hv);
    double const* dS = dh + ix.state(c.slot, c.hv);
    double const* G_last = G + ix.gate(c.last(), c.hv);
    auto row = [&](int64_t i) { return c.begin + i; };

    // ds = scale causal(dO Delta^T), n x n.
    std::vector<double> ds(n * n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      double const* do_i = d_o + ix.val(row(i), c.hv);
      for (int64_t j = 0; j <= i; ++j) {
        double const* delta_j = v_new + ix.val(row(j), c.hv);
        double dot = 0;
        for (int64_t e = 0; e < V; ++e) dot += do_i[e] * delta_j[e];
        ds[i * n + j] = scale * dot;
      }
    }

    std::vector<double> dG_ch(n * K, 0.0);  // per key channel, folded for GDN at the end
    for (int64_t i = 0; i < n; ++i) {
      double const* q_i = q + ix.qk(row(i), c.h);
      double const* k_i = k + ix.qk(row(i), c.h);
      double const* G_i = G + ix.gate(row(i), c.hv);
      double const* do_i = d_o + ix.val(row(i), c.hv);
      double const* delta_i = v_new + ix.val(row(i), c.hv);
      double const* ddelta_i = dv_new + ix.val(row(i), c.hv);
      double* dq_i = dq + ix.key(row(i), c.hv);
      double* dk_i = dk + ix.key(row(i), c.hv);
      double* dw_i = dw + ix.key(row(i), c.hv);
      for (int64_t d = 0; d < K; ++d) {
        // Inter-chunk terms: through h in o_i, through the end state, through Delta = U - W h.
        double h_do = 0, dS_delta = 0, h_ddelta = 0;
        for (int64_t e = 0; e < V; ++e) {
          h_do += h_c[d * V + e] * do_i[e];
          dS_delta += dS[d * V + e] * delta_i[e];
          h_ddelta += h_c[d * V + e] * ddelta_i[e];
        }
        double const ebar = decay_pair(G_last, G_i, d, ix.gate_stride);
        double const dq_inter = scale * std::exp(G_i[d * ix.gate_stride]) * h_do;
        double const dk_inter = ebar * dS_delta;
        double dq_id = dq_inter;
        double dk_id = dk_inter;
        dG_ch[i * K + d] += q_i[d] * dq_inter;
        if (i < n - 1) {  // ebar_i = e^{G_last - G_i}; for the last row it is 1
          dG_ch[i * K + d] -= k_i[d] * dk_inter;
          dG_ch[(n - 1) * K + d] += k_i[d] * dk_inter;
        }
        // Intra-chunk terms: through Aqk_ij (as q_i) and Aqk_mi (as k_i).
        for (int64_t j = 0; j <= i; ++j) {
          double const* k_j = k + ix.qk(row(j), c.h);
          double const* G_j = G + ix.gate(row(j), c.hv);
          double const term = ds[i * n + j] * k_j[d] * decay_pair(G_i, G_j, d, ix.gate_stride);
          dq_id += term;
          if (j < i) {  // Gamma_ij = e^{G_i - G_j}; Gamma_ii = 1 carries no gate
            dG_ch[i * K + d] += q_i[d] * term;
            dG_ch[j * K + d] -= q_i[d] * term;
          }
        }
        for (int64_t m = i; m < n; ++m) {
          double const* q_m = q + ix.qk(row(m), c.h);
          double const* G_m = G + ix.gate(row(m), c.hv);
          dk_id += ds[m * n + i] * q_m[d] * decay_pair(G_m, G_i, d, ix.gate_stride);
        }
        dq_i[d] = dq_id;
        dk_i[d] = dk_id;
        dw_i[d] = -h_ddelta;
      }
    }
    // gamma = e^{G_last} scales the start state's contribution to the end state.
    for (int64_t d = 0; d < K; ++d) {
      double h_dS = 0;
      for (int64_t e = 0; e < V; ++e) h_dS += h_c[d * V + e] * dS[d * V + e];
      dG_ch[(n - 1) * K + d] += std::exp(G_last[d * ix.gate_stride]) * h_dS;
    }

    for (int64_t t = c.begin; t <= c.last(); ++t)
      for (int64_t d = 0; d < ix.gate_width; ++d) dG[ix.gate(t, c.hv) + d] = 0;
    add_gate_grad(ix, c, dG_ch, dG);
  });
}

}  // namespace cake::ref
