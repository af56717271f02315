// Test helpers for the FP64 reference: random problems, finite differences, error norms.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "ref/problem.hpp"

namespace cake::testing {

// Owns the arrays of one problem and hands out ref::Inputs views.
struct RefProblem {
  ref::Shape shape;
  double scale = 1.0;
  std::vector<double> q, k, v, g, beta, h0;  // h0 empty: no initial state

  ref::Inputs inputs() const {
    return {q.data(), k.data(), v.data(), g.data(), beta.data(), h0.empty() ? nullptr : h0.data(),
            scale};
  }
  int64_t state_size() const {
    return shape.num_seqs() * shape.num_v_heads * shape.head_dim_k * shape.head_dim_v;
  }
  int64_t o_size() const { return shape.num_tokens * shape.num_v_heads * shape.head_dim_v; }
};

// Random problem: q, k ~ N(0, 1) normalised per token and head (as use_qk_l2norm gives), v ~ N(0,1),
// g uniform in [g_min, g_max], beta uniform in [0.05, 0.95].
inline RefProblem random_problem(ref::Gate gate, std::vector<int64_t> doc_lengths, int64_t H,
                                 int64_t HV, int64_t K, int64_t V, bool with_h0, uint64_t seed,
                                 double g_min = -1.0, double g_max = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  RefProblem p;
  p.shape.gate = gate;
  p.shape.num_qk_heads = H;
  p.shape.num_v_heads = HV;
  p.shape.head_dim_k = K;
  p.shape.head_dim_v = V;
  p.shape.cu_seqlens = {0};
  for (int64_t n : doc_lengths) p.shape.cu_seqlens.push_back(p.shape.cu_seqlens.back() + n);
  int64_t const T = p.shape.cu_seqlens.back();
  p.shape.num_tokens = T;
  p.scale = 1.0 / std::sqrt(static_cast<double>(K));
  auto normalised = [&](std::vector<double>& x) {
    x.resize(T * H * K);
    for (auto& e : x) e = normal(rng);
    for (int64_t row = 0; row < T * H; ++row) {
      double ss = 0;
      for (int64_t i = 0; i < K; ++i) ss += x[row * K + i] * x[row * K + i];
      for (int64_t i = 0; i < K; ++i) x[row * K + i] /= std::sqrt(ss);
    }
  };
  normalised(p.q);
  normalised(p.k);
  p.v.resize(T * HV * V);
  for (auto& e : p.v) e = normal(rng);
  p.g.resize(T * HV * p.shape.gate_width());
  for (auto& e : p.g) e = g_min + (g_max - g_min) * uniform(rng);
  p.beta.resize(T * HV);
  for (auto& e : p.beta) e = 0.05 + 0.9 * uniform(rng);
  if (with_h0) {
    p.h0.resize(p.state_size());
    for (auto& e : p.h0) e = normal(rng);
  }
  return p;
}

// ||a - b|| / ||b|| (0 when both are zero).
inline double rel_error(std::vector<double> const& a, std::vector<double> const& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline std::vector<double> random_vector(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(n);
  for (auto& e : x) e = normal(rng);
  return x;
}

// Central difference of a scalar function f(x) in direction d: (f(x + e d) - f(x - e d)) / 2e.
template <class F>
double directional_derivative(std::vector<double>& x, std::vector<double> const& d, F const& f,
                              double eps = 1e-6) {
  std::vector<double> const saved = x;
  for (size_t i = 0; i < x.size(); ++i) x[i] = saved[i] + eps * d[i];
  double const plus = f();
  for (size_t i = 0; i < x.size(); ++i) x[i] = saved[i] - eps * d[i];
  double const minus = f();
  x = saved;
  return (plus - minus) / (2 * eps);
}

// The gradient of a scalar function f of x by central differences, one element at a time (for
// small x): (f(x + h e_i) - f(x - h e_i)) / 2h.
template <class F>
std::vector<double> finite_difference_gradient(std::vector<double>& x, F const& f,
                                               double h = 1e-6) {
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double const keep = x[i];
    x[i] = keep + h;
    double const up = f();
    x[i] = keep - h;
    double const down = f();
    x[i] = keep;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

inline double dot(std::vector<double> const& a, std::vector<double> const& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace cake::testing
