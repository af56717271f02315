// One row at a time; the backward follows the forward's terms in the same order.
#include "ref/norm.hpp"

#include "ref/logistic.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cake::ref {

namespace {

double activate(GateActivation a, double g) {
  return a == GateActivation::kSilu ? g * sigmoid(g) : sigmoid(g);
}

// d act / d g at g.
double activation_slope(GateActivation a, double g) {
  return a == GateActivation::kSilu ? silu_slope(g) : sigmoid_slope(g);
}

}  // namespace

void rms_norm_forward(NormShape const& s, NormInputs const& in, double* y, double* rstd) {
  int64_t const N = s.dim;
  for (int64_t r = 0; r < s.rows; ++r) {
    double const* x = in.x + r * N;
    double sum_squares = 0.0;
    for (int64_t i = 0; i < N; ++i) sum_squares += x[i] * x[i];
    double const row_rstd = 1.0 / std::sqrt(sum_squares / static_cast<double>(N) + in.eps);
    rstd[r] = row_rstd;
    for (int64_t i = 0; i < N; ++i) {
      double out = x[i] * row_rstd;
      if (in.weight != nullptr) out *= in.weight[i];
      if (in.g != nullptr) out *= activate(in.activation, in.g[r * N + i]);
      y[r * N + i] = out;
    }
  }
}

void rms_norm_backward(NormShape const& s, NormInputs const& in, double const* rstd,
                       double const* dy, NormGrads const& grads) {
  int64_t const N = s.dim;
  if (grads.dweight != nullptr) std::fill(grads.dweight, grads.dweight + N, 0.0);
  std::vector<double> n(N), dn(N);
  for (int64_t r = 0; r < s.rows; ++r) {
    double dn_dot_n = 0.0;
    for (int64_t i = 0; i < N; ++i) {
      int64_t const k = r * N + i;
      double const w = in.weight != nullptr ? in.weight[i] : 1.0;
      double const a = in.g != nullptr ? activate(in.activation, in.g[k]) : 1.0;
      n[i] = in.x[k] * rstd[r];
      dn[i] = dy[k] * w * a;
      dn_dot_n += dn[i] * n[i];
      if (grads.dg != nullptr)
        grads.dg[k] = dy[k] * n[i] * w * activation_slope(in.activation, in.g[k]);
      if (grads.dweight != nullptr) grads.dweight[i] += dy[k] * n[i] * a;
    }
    double const mean_dn_n = dn_dot_n / static_cast<double>(N);
    if (grads.dx != nullptr) {
      for (int64_t i = 0; i < N; ++i) grads.dx[r * N + i] = rstd[r] * (dn[i] - n[i] * mean_dn_n);
    }
  }
}

}  // namespace cake::ref
