#include "ref/preprocess.hpp"

#include "ref/logistic.hpp"

#include <cmath>

namespace cake::ref {

namespace {

constexpr double kL2NormEps = 1e-6;

// log(1 + e^x) without overflow for large x or loss for very negative x.
double softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }

}  // namespace

void l2norm_forward(std::vector<double> const& x, int64_t width, std::vector<double>& y,
                    std::vector<double>& rstd) {
  int64_t const rows = static_cast<int64_t>(x.size()) / width;
  y.resize(x.size());
  rstd.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < width; ++i) ss += x[r * width + i] * x[r * width + i];
    rstd[r] = 1.0 / std::sqrt(ss + kL2NormEps);
    for (int64_t i = 0; i < width; ++i) y[r * width + i] = x[r * width + i] * rstd[r];
  }
}

std::vector<double> l2norm_backward(std::vector<double> const& dy, std::vector<double> const& y,
                                    std::vector<double> const& rstd, int64_t width) {
  std::vector<double> dx(dy.size());
  for (int64_t r = 0; r < static_cast<int64_t>(rstd.size()); ++r) {
    double dot = 0;
    for (int64_t i = 0; i < width; ++i) dot += dy[r * width + i] * y[r * width + i];
    for (int64_t i = 0; i < width; ++i) {
      dx[r * width + i] = rstd[r] * (dy[r * width + i] - dot * y[r * width + i]);
    }
  }
  return dx;
}

// Index helpers: element e of g_raw [T, HV, W] belongs to head (e / W) % HV, bias slot e % (HV W).
std::vector<double> gate_forward(GateParams const& p, std::vector<double> const& g_raw) {
  int64_t const per_token = p.num_v_heads * p.width;
  std::vector<double> g(g_raw.size());
  for (size_t e = 0; e < g_raw.size(); ++e) {
    int64_t const slot = static_cast<int64_t>(e) % per_token;
    int64_t const hv = slot / p.width;
    double const x = g_raw[e] + (p.dt_bias.empty() ? 0.0 : p.dt_bias[slot]);
    double const a = p.A_log.empty() ? 1.0 : std::exp(p.A_log[hv]);
    g[e] = p.lower_bound ? *p.lower_bound * sigmoid(a * x) : -a * softplus(x);
  }
  return g;
}

GateGrads gate_backward(GateParams const& p, std::vector<double> const& g_raw,
                        std::vector<double> const& dg) {
  int64_t const per_token = p.num_v_heads * p.width;
  GateGrads out;
  out.dg_raw.resize(g_raw.size());
  out.dA_log.assign(p.A_log.size(), 0.0);
  out.ddt_bias.assign(p.dt_bias.size(), 0.0);
  for (size_t e = 0; e < g_raw.size(); ++e) {
    int64_t const slot = static_cast<int64_t>(e) % per_token;
    int64_t const hv = slot / p.width;
    double const x = g_raw[e] + (p.dt_bias.empty() ? 0.0 : p.dt_bias[slot]);
    double const a = p.A_log.empty() ? 1.0 : std::exp(p.A_log[hv]);
    double dx, dA_log;
    if (p.lower_bound) {
      // g = lb s(z), z = a x: dz = dg lb s'(z); dx = a dz; d(A_log) = dz z.
      double const dz = dg[e] * *p.lower_bound * sigmoid_slope(a * x);
      dx = a * dz;
      dA_log = dz * a * x;
    } else {
      // g = -a softplus(x): dx = -a sigmoid(x) dg; d(A_log) = g dg.
      dx = -a * sigmoid(x) * dg[e];
      dA_log = -a * softplus(x) * dg[e];
    }
    out.dg_raw[e] = dx;
    if (!p.A_log.empty()) out.dA_log[hv] += dA_log;
    if (!p.dt_bias.empty()) out.ddt_bias[slot] += dx;
  }
  return out;
}

std::vector<double> beta_sigmoid_forward(std::vector<double> const& beta_raw, double c) {
  std::vector<double> beta(beta_raw.size());
  for (size_t i = 0; i < beta.size(); ++i) beta[i] = c * sigmoid(beta_raw[i]);
  return beta;
}

std::vector<double> beta_sigmoid_backward(std::vector<double> const& beta_raw, double c,
                                          std::vector<double> const& dbeta) {
  std::vector<double> dbeta_raw(beta_raw.size());
  for (size_t i = 0; i < beta_raw.size(); ++i) {
    dbeta_raw[i] = dbeta[i] * c * sigmoid_slope(beta_raw[i]);
  }
  return dbeta_raw;
}

}  // namespace cake::ref
