// The FP64 causal conv1d (ref/conv1d.hpp): the forward against a hand example and an independent
// token-indexed formula, the backward against central finite differences of a scalar loss, for
// widths 1..5, packs with documents shorter than, equal to and longer than W, and empty ones;
// and the C ABI's CPU path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cake/cake.h"
#include "core/tensor.hpp"
#include "ref/conv1d.hpp"
#include "ref_testing.hpp"

namespace {

using cake::ref::Activation;
using cake::ref::Conv1dShape;
using cake::testing::dot;
using cake::testing::finite_difference_gradient;
using cake::testing::random_vector;
using cake::testing::rel_error;
using Vec = std::vector<double>;

struct Problem {
  Conv1dShape shape;
  Vec x, weight, bias, residual, h0;  // bias, residual, h0 empty: absent
  Activation activation = Activation::kNone;

  cake::ref::Conv1dInputs inputs() const {
    auto opt = [](Vec const& v) { return v.empty() ? nullptr : v.data(); };
    return {x.data(), weight.data(), opt(bias), opt(residual), opt(h0), activation};
  }
};

Problem random_problem(std::vector<int64_t> const& lengths, int64_t D, int64_t W, bool extras,
                       Activation activation, uint64_t seed) {
  Problem p;
  p.shape.dim = D;
  p.shape.width = W;
  p.shape.cu_seqlens = {0};
  for (int64_t n : lengths) p.shape.cu_seqlens.push_back(p.shape.cu_seqlens.back() + n);
  int64_t const T = p.shape.cu_seqlens.back(), N = p.shape.num_seqs();
  p.shape.num_tokens = T;
  p.x = random_vector(T * D, seed);
  p.weight = random_vector(D * W, seed + 1);
  if (extras) {
    p.bias = random_vector(D, seed + 2);
    p.residual = random_vector(T * D, seed + 3);
    p.h0 = random_vector(N * D * W, seed + 4);
  }
  p.activation = activation;
  return p;
}

struct Forward {
  Vec y, ht;
};

Forward forward(Problem const& p) {
  Forward f{Vec(p.shape.num_tokens * p.shape.dim, NAN),
            Vec(p.shape.num_seqs() * p.shape.dim * p.shape.width, NAN)};
  cake::ref::conv1d_forward(p.shape, p.inputs(), {f.y.data(), f.ht.data()});
  return f;
}

// The value at packed token q as document n's conv sees it: the token itself when it belongs to
// n, else the initial state's column W + (q - start of n), else zero.
double source(Problem const& p, int64_t n, int64_t q, int64_t d) {
  int64_t const bos = p.shape.cu_seqlens[n], W = p.shape.width, D = p.shape.dim;
  if (q >= bos) return p.x[q * D + d];
  if (p.h0.empty()) return 0.0;
  return p.h0[(n * D + d) * W + W + (q - bos)];
}

Forward direct_forward(Problem const& p) {
  int64_t const D = p.shape.dim, W = p.shape.width;
  Forward f{Vec(p.x.size()), Vec(p.shape.num_seqs() * D * W)};
  for (int64_t n = 0; n < p.shape.num_seqs(); ++n) {
    int64_t const end = p.shape.cu_seqlens[n + 1];
    for (int64_t q = p.shape.cu_seqlens[n]; q < end; ++q) {
      for (int64_t d = 0; d < D; ++d) {
        double pre = p.bias.empty() ? 0.0 : p.bias[d];
        for (int64_t i = 0; i < W; ++i) pre += p.weight[d * W + i] * source(p, n, q - W + 1 + i, d);
        double y = p.activation == Activation::kSilu ? pre / (1.0 + std::exp(-pre)) : pre;
        f.y[q * D + d] = y + (p.residual.empty() ? 0.0 : p.residual[q * D + d]);
      }
    }
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t c = 0; c < W; ++c) f.ht[(n * D + d) * W + c] = source(p, n, end - W + c, d);
    }
  }
  return f;
}

TEST(Conv1dReference, HandExample) {
  // One channel, W = 3, weight (a, b, c) = (2, 3, 5): weight[W - 1] multiplies the current token.
  Problem p;
  p.shape = {3, 1, 3, {0, 3}};
  p.x = {1, 10, 100};
  p.weight = {2, 3, 5};
  Forward const f = forward(p);
  EXPECT_EQ(f.y, (Vec{5, 3 + 50, 2 + 30 + 500}));
  EXPECT_EQ(f.ht, (Vec{1, 10, 100}));
  // A document of one token keeps the initial state's tail in front of it.
  p.shape = {1, 1, 3, {0, 1}};
  p.x = {7};
  p.h0 = {-1, -2, -3};
  Forward const g = forward(p);
  EXPECT_EQ(g.y, (Vec{2 * -2 + 3 * -3 + 5 * 7}));
  EXPECT_EQ(g.ht, (Vec{-2, -3, 7}));
}

struct Case {
  std::vector<int64_t> lengths;
  int64_t D, W;
  bool extras;
  Activation activation;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t W = 1; W <= 5; ++W) {
    for (bool extras : {false, true}) {
      for (Activation a : {Activation::kNone, Activation::kSilu}) {
        out.push_back({{1, 2, 3, 4, 5, W - 1, W, W + 1, 0, 9}, 3, W, extras, a});
      }
    }
  }
  return out;
}

TEST(Conv1dReference, ForwardMatchesTokenFormula) {
  uint64_t seed = 1;
  for (Case const& c : cases()) {
    Problem const p = random_problem(c.lengths, c.D, c.W, c.extras, c.activation, seed += 10);
    Forward const f = forward(p), g = direct_forward(p);
    SCOPED_TRACE("W = " + std::to_string(c.W) + (c.extras ? " with extras" : ""));
    EXPECT_LT(rel_error(f.y, g.y), 1e-15);
    EXPECT_LT(rel_error(f.ht, g.ht), 1e-15);
  }
}

// loss = <y, ry> + <ht, rh>; its gradient is the backward with dy = ry, dht = rh.
TEST(Conv1dReference, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 1000;
  for (Case const& c : cases()) {
    Problem p = random_problem(c.lengths, c.D, c.W, c.extras, c.activation, seed += 10);
    int64_t const T = p.shape.num_tokens, D = c.D, W = c.W, N = p.shape.num_seqs();
    Vec const ry = random_vector(T * D, seed + 5), rh = random_vector(N * D * W, seed + 6);
    Vec dx(T * D, NAN), dw(D * W, NAN), db(D, NAN), dr(T * D, NAN), dh0(N * D * W, NAN);
    cake::ref::conv1d_backward(p.shape, p.inputs(), ry.data(), rh.data(),
                               {dx.data(), dw.data(), c.extras ? db.data() : nullptr,
                                c.extras ? dr.data() : nullptr, c.extras ? dh0.data() : nullptr});
    auto loss = [&] {
      Forward const f = forward(p);
      return dot(f.y, ry) + dot(f.ht, rh);
    };
    auto check = [&](char const* name, Vec& input, Vec const& grad) {
      SCOPED_TRACE(std::string(name) + ", W = " + std::to_string(W));
      EXPECT_LT(rel_error(grad, finite_difference_gradient(input, loss)), 1e-7);
    };
    check("dx", p.x, dx);
    check("dweight", p.weight, dw);
    if (c.extras) {
      check("dbias", p.bias, db);
      check("dresidual", p.residual, dr);
      check("dh0", p.h0, dh0);
    }
  }
}

TEST(Conv1dReference, NoLeakageAcrossDocuments) {
  // Changing document 1 changes nothing of document 0's or 2's outputs and states.
  Problem p = random_problem({3, 2, 4}, 2, 4, true, Activation::kSilu, 77);
  Forward const before = forward(p);
  for (int64_t q = 3; q < 5; ++q) p.x[q * 2] += 1.0;
  Forward const after = forward(p);
  for (int64_t q : {0, 1, 2, 5, 6, 7, 8}) {
    EXPECT_EQ(before.y[q * 2], after.y[q * 2]) << "token " << q;
  }
  for (int64_t n : {0, 2}) {
    for (int64_t c = 0; c < 4; ++c)
      EXPECT_EQ(before.ht[(n * 2) * 4 + c], after.ht[(n * 2) * 4 + c]);
  }
  EXPECT_NE(before.y[3 * 2], after.y[3 * 2]);
}

}  // namespace

namespace {

// The C ABI on CPU tensors: the reference behind it, dresidual = dy, no workspace, and a failure
// that names its argument.
TEST(Conv1dAbi, CpuBackwardThroughTheAbi) {
  Problem p = random_problem({2, 5}, 3, 4, true, Activation::kSilu, 5);
  int64_t const T = p.shape.num_tokens, D = 3, W = 4, N = 2;
  std::vector<int64_t> cu = p.shape.cu_seqlens;
  Vec dy = random_vector(T * D, 9), dx(T * D, NAN), dw(D * W, NAN), db(D, NAN), dr(T * D, NAN),
      dh0(N * D * W, NAN);
  auto view = [](Vec& v, std::vector<int64_t> const& shape) {
    return cake::dense_view(v.data(), cakeFloat64, cakeCPU, shape);
  };
  cakeConv1dBackwardArgs_t a{};
  a.struct_size = sizeof a;
  a.activation = cakeActivationSilu;
  a.x = view(p.x, {1, T, D});
  a.weight = view(p.weight, {D, W});
  a.bias = view(p.bias, {D});
  a.initial_state = view(p.h0, {N, D, W});
  a.cu_seqlens = cake::dense_view(cu.data(), cakeInt64, cakeCPU, {N + 1});
  a.dy = view(dy, {1, T, D});
  a.dx = view(dx, {1, T, D});
  a.dweight = view(dw, {D, W});
  a.dbias = view(db, {D});
  a.dresidual = view(dr, {1, T, D});
  a.dinitial_state = view(dh0, {N, D, W});
  size_t bytes = 1;
  ASSERT_EQ(cakeConv1dBackwardWorkspaceSize(&a, &bytes), cakeSuccess) << cakeGetLastError();
  EXPECT_EQ(bytes, 0u);
  ASSERT_EQ(cakeConv1dBackward(&a, nullptr, 0, nullptr), cakeSuccess) << cakeGetLastError();
  EXPECT_EQ(dr, dy);
  Vec dx_ref(T * D), dw_ref(D * W), db_ref(D), dh0_ref(N * D * W);
  cake::ref::conv1d_backward(
      p.shape, p.inputs(), dy.data(), nullptr,
      {dx_ref.data(), dw_ref.data(), db_ref.data(), nullptr, dh0_ref.data()});
  EXPECT_EQ(dx, dx_ref);
  EXPECT_EQ(dw, dw_ref);
  EXPECT_EQ(db, db_ref);
  EXPECT_EQ(dh0, dh0_ref);

  a.dbias = view(db, {D + 1});
  EXPECT_EQ(cakeConv1dBackward(&a, nullptr, 0, nullptr), cakeInvalidArgument);
  EXPECT_STREQ(cakeGetLastError(), "dbias must have shape [D] (as bias) = [3], got [4]");

  // In place (dx over dy) is refused by the run, before anything is written.
  a.dbias = view(db, {D});
  a.dx = a.dy;
  Vec const dy_before = dy;
  EXPECT_EQ(cakeConv1dBackward(&a, nullptr, 0, nullptr), cakeInvalidArgument);
  EXPECT_NE(std::string(cakeGetLastError()).find("dx must not share memory with dy"),
            std::string::npos)
      << cakeGetLastError();
  EXPECT_EQ(dy, dy_before);
}

TEST(Conv1dAbi, InPlaceForwardIsRefused) {
  Problem p = random_problem({2, 5}, 3, 4, true, Activation::kSilu, 5);
  int64_t const T = p.shape.num_tokens, D = 3, W = 4;
  cakeConv1dForwardArgs_t a{};
  a.struct_size = sizeof a;
  a.activation = cakeActivationSilu;
  a.x = cake::dense_view(p.x.data(), cakeFloat64, cakeCPU, {1, T, D});
  a.weight = cake::dense_view(p.weight.data(), cakeFloat64, cakeCPU, {D, W});
  a.y = a.x;
  size_t bytes = 1;
  EXPECT_EQ(cakeConv1dForwardWorkspaceSize(&a, &bytes), cakeSuccess) << cakeGetLastError();
  Vec const x_before = p.x;
  EXPECT_EQ(cakeConv1dForward(&a, nullptr, 0, nullptr), cakeInvalidArgument);
  EXPECT_NE(std::string(cakeGetLastError()).find("y must not share memory with x"),
            std::string::npos)
      << cakeGetLastError();
  EXPECT_EQ(p.x, x_before);
}

}  // namespace
