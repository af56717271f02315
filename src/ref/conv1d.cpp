// One channel of one document at a time, on its extended sequence (conv1d.hpp): the backward
// transposes the forward's sums term by term, so that every gradient is the exact adjoint.
#include "ref/conv1d.hpp"

#include "ref/logistic.hpp"

#include <algorithm>
#include <cmath>

namespace cake::ref {

namespace {

// e[j] for j in [-W, L) of one (document, channel): the W state columns, then the tokens.
struct Extended {
  int64_t width;
  std::vector<double> values;  // [W + L]
  double operator[](int64_t j) const { return values[j + width]; }
};

Extended extended(Conv1dShape const& s, Conv1dInputs const& in, int64_t n, int64_t d) {
  int64_t const bos = s.cu_seqlens[n], len = s.cu_seqlens[n + 1] - bos, W = s.width;
  Extended e{W, std::vector<double>(W + len, 0.0)};
  if (in.h0 != nullptr) {
    for (int64_t c = 0; c < W; ++c) e.values[c] = in.h0[(n * s.dim + d) * W + c];
  }
  for (int64_t t = 0; t < len; ++t) e.values[W + t] = in.x[(bos + t) * s.dim + d];
  return e;
}

double pre_activation(Conv1dShape const& s, Conv1dInputs const& in, Extended const& e, int64_t d,
                      int64_t t) {
  int64_t const W = s.width;
  double acc = in.bias != nullptr ? in.bias[d] : 0.0;
  for (int64_t i = 0; i < W; ++i) acc += in.weight[d * W + i] * e[t - (W - 1) + i];
  return acc;
}

double activate(Activation a, double p) { return a == Activation::kSilu ? p * sigmoid(p) : p; }

// d act / d pre at p.
double activation_slope(Activation a, double p) {
  return a == Activation::kNone ? 1.0 : silu_slope(p);
}

}  // namespace

void conv1d_forward(Conv1dShape const& s, Conv1dInputs const& in, Conv1dOutputs const& out) {
  int64_t const D = s.dim, W = s.width;
  for (int64_t n = 0; n < s.num_seqs(); ++n) {
    int64_t const bos = s.cu_seqlens[n], len = s.cu_seqlens[n + 1] - bos;
    for (int64_t d = 0; d < D; ++d) {
      Extended const e = extended(s, in, n, d);
      for (int64_t t = 0; t < len; ++t) {
        double y = activate(in.activation, pre_activation(s, in, e, d, t));
        if (in.residual != nullptr) y += in.residual[(bos + t) * D + d];
        out.y[(bos + t) * D + d] = y;
      }
      if (out.ht != nullptr) {
        for (int64_t c = 0; c < W; ++c) out.ht[(n * D + d) * W + c] = e[len - W + c];
      }
    }
  }
}

void conv1d_backward(Conv1dShape const& s, Conv1dInputs const& in, double const* dy,
                     double const* dht, Conv1dGrads const& g) {
  int64_t const D = s.dim, W = s.width;
  if (g.dweight != nullptr) std::fill(g.dweight, g.dweight + D * W, 0.0);
  if (g.dbias != nullptr) std::fill(g.dbias, g.dbias + D, 0.0);
  if (g.dresidual != nullptr) std::copy(dy, dy + s.num_tokens * D, g.dresidual);
  for (int64_t n = 0; n < s.num_seqs(); ++n) {
    int64_t const bos = s.cu_seqlens[n], len = s.cu_seqlens[n + 1] - bos;
    for (int64_t d = 0; d < D; ++d) {
      Extended const e = extended(s, in, n, d);
      // de[j + W]: the gradient of e[j], j in [-W, L).
      std::vector<double> de(W + len, 0.0);
      if (dht != nullptr) {
        for (int64_t c = 0; c < W; ++c) de[len + c] += dht[(n * D + d) * W + c];  // e[len-W+c]
      }
      for (int64_t t = 0; t < len; ++t) {
        double const p = pre_activation(s, in, e, d, t);
        double const dpre = dy[(bos + t) * D + d] * activation_slope(in.activation, p);
        for (int64_t i = 0; i < W; ++i) {
          int64_t const j = t - (W - 1) + i;
          de[j + W] += in.weight[d * W + i] * dpre;
          if (g.dweight != nullptr) g.dweight[d * W + i] += dpre * e[j];
        }
        if (g.dbias != nullptr) g.dbias[d] += dpre;
      }
      if (g.dx != nullptr) {
        for (int64_t t = 0; t < len; ++t) g.dx[(bos + t) * D + d] = de[W + t];
      }
      if (g.dh0 != nullptr) {
        for (int64_t c = 0; c < W; ++c) g.dh0[(n * D + d) * W + c] = de[c];
      }
    }
  }
}

}  // namespace cake::ref
