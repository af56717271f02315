// Backward stage 7: through W = T X, U = T Y and T = (I + L)^-1 (chunk_wy_bwd.hpp).
#include "ref/chunk_wy_bwd.hpp"

#include <algorithm>

namespace cake::ref {

void chunk_wy_backward(Shape const& shape, ChunkTiling const& tiling, double const* k,
                       double const* v, double const* beta, double const* G, double const* A,
                       double const* dw, double const* dv_new, double* dk, double* dv,
                       double* dbeta, double* dG) {
  Layout const ix(shape, tiling.chunk_size);
  int64_t const K = ix.K, V = ix.V;
  for_each_chunk(shape, tiling, [&](Chunk const& c) {
    int64_t const n = c.size;
    auto row = [&](int64_t i) { return c.begin + i; };
    auto T = [&](int64_t i, int64_t j) { return A[ix.row(row(i), c.hv) + j]; };
    auto beta_of = [&](int64_t i) { return beta[ix.head(row(i), c.hv)]; };

    // X = diag(beta) (K * e^G), n x K; Y = diag(beta) V is read from v directly.
    std::vector<double> X(n * K);
    for (int64_t i = 0; i < n; ++i) {
      double const* k_i = k + ix.qk(row(i), c.h);
      double const* G_i = G + ix.gate(row(i), c.hv);
      for (int64_t d = 0; d < K; ++d)
        X[i * K + d] = beta_of(i) * k_i[d] * std::exp(G_i[d * ix.gate_stride]);
    }

    // dT = dW X^T + dU Y^T on and below the diagonal (T is lower, so only that part reaches L).
    std::vector<double> dT(n * n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      double const* dw_i = dw + ix.key(row(i), c.hv);
      double const* du_i = dv_new + ix.val(row(i), c.hv);
      for (int64_t j = 0; j <= i; ++j) {
        double const* v_j = v + ix.val(row(j), c.hv);
        double sum = 0;
        for (int64_t d = 0; d < K; ++d) sum += dw_i[d] * X[j * K + d];
        double sum_v = 0;
        for (int64_t e = 0; e < V; ++e) sum_v += du_i[e] * v_j[e];
        dT[i * n + j] = sum + beta_of(j) * sum_v;
      }
    }

    // dX = T^T dW, dY = T^T dU.
    std::vector<double> dX(n * K, 0.0), dY(n * V, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      double const* dw_i = dw + ix.key(row(i), c.hv);
      double const* du_i = dv_new + ix.val(row(i), c.hv);
      for (int64_t j = 0; j <= i; ++j) {
        for (int64_t d = 0; d < K; ++d) dX[j * K + d] += T(i, j) * dw_i[d];
        for (int64_t e = 0; e < V; ++e) dY[j * V + e] += T(i, j) * du_i[e];
      }
    }

    // dL = -T^T dT T^T, strictly lower. P = T^T dT first: P_ib = sum_{a >= i} T_ai dT_ab.
    std::vector<double> P(n * n, 0.0), dL(n * n, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t b = 0; b < n; ++b)
        for (int64_t a = std::max(i, b); a < n; ++a) P[i * n + b] += T(a, i) * dT[a * n + b];
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < i; ++j) {
        double sum = 0;
        for (int64_t b = 0; b <= j; ++b) sum += P[i * n + b] * T(j, b);
        dL[i * n + j] = -sum;
      }

    std::vector<double> dG_ch(n * K, 0.0);  // per key channel, folded for GDN at the end
    for (int64_t i = 0; i < n; ++i) {
      double const* k_i = k + ix.qk(row(i), c.h);
      double const* v_i = v + ix.val(row(i), c.hv);
      double const* G_i = G + ix.gate(row(i), c.hv);
      double* dk_i = dk + ix.key(row(i), c.hv);
      double* dv_i = dv + ix.val(row(i), c.hv);
      double const b_i = beta_of(i);
      // Through Y and X: Y_i = beta_i v_i, X_i = beta_i k_i * e_i.
      double dbeta_i = 0;
      for (int64_t e = 0; e < V; ++e) {
        dv_i[e] = b_i * dY[i * V + e];
        dbeta_i += dY[i * V + e] * v_i[e];
      }
      for (int64_t d = 0; d < K; ++d) {
        double const ke = k_i[d] * std::exp(G_i[d * ix.gate_stride]);
        dbeta_i += dX[i * K + d] * ke;
        dk_i[d] += b_i * std::exp(G_i[d * ix.gate_stride]) * dX[i * K + d];
        dG_ch[i * K + d] += b_i * ke * dX[i * K + d];
      }
      // Through L_ij = beta_i <k_i, k_j * Gamma_ij>, j < i.
      for (int64_t j = 0; j < i; ++j) {
        double const* k_j = k + ix.qk(row(j), c.h);
        double const* G_j = G + ix.gate(row(j), c.hv);
        double* dk_j = dk + ix.key(row(j), c.hv);
        double const dl = dL[i * n + j];
        for (int64_t d = 0; d < K; ++d) {
          double const gamma = decay_pair(G_i, G_j, d, ix.gate_stride);
          double const kk = k_i[d] * k_j[d] * gamma;
          dbeta_i += dl * kk;
          dk_i[d] += b_i * dl * k_j[d] * gamma;
          dk_j[d] += b_i * dl * k_i[d] * gamma;
          dG_ch[i * K + d] += b_i * dl * kk;
          dG_ch[j * K + d] -= b_i * dl * kk;
        }
      }
      dbeta[ix.head(row(i), c.hv)] = dbeta_i;
    }

    add_gate_grad(ix, c, dG_ch, dG);
  });
}

}  // namespace cake::ref
