// The FP64 gated RMSNorm (ref/norm.hpp): the forward against the formula written out per element,
// the backward against central finite differences of a scalar loss, for both activations, with
// and without gate and weight; and the C ABI's CPU path and its validation messages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cake/cake.h"
#include "core/tensor.hpp"
#include "ref/norm.hpp"
#include "ref_testing.hpp"

namespace {

using cake::ref::GateActivation;
using cake::testing::dot;
using cake::testing::finite_difference_gradient;
using cake::testing::random_vector;
using cake::testing::rel_error;
using Vec = std::vector<double>;

struct Problem {
  cake::ref::NormShape shape;
  Vec x, g, weight;  // g, weight empty: absent
  double eps = 1e-5;
  GateActivation activation = GateActivation::kSilu;

  cake::ref::NormInputs inputs() const {
    auto opt = [](Vec const& v) { return v.empty() ? nullptr : v.data(); };
    return {x.data(), opt(g), opt(weight), eps, activation};
  }
};

Problem random_problem(int64_t rows, int64_t N, bool gated, bool weighted, GateActivation a,
                       uint64_t seed) {
  Problem p;
  p.shape = {rows, N};
  p.x = random_vector(rows * N, seed);
  if (gated) p.g = random_vector(rows * N, seed + 1);
  if (weighted) p.weight = random_vector(N, seed + 2);
  p.activation = a;
  return p;
}

struct Forward {
  Vec y, rstd;
};

Forward forward(Problem const& p) {
  Forward f{Vec(p.x.size(), NAN), Vec(p.shape.rows, NAN)};
  cake::ref::rms_norm_forward(p.shape, p.inputs(), f.y.data(), f.rstd.data());
  return f;
}

// y[r, i] = x[r, i] / sqrt(sum_k x[r, k]^2 / N + eps) * weight[i] * act(g[r, i]), spelt out.
Vec direct_forward(Problem const& p) {
  int64_t const N = p.shape.dim;
  Vec y(p.x.size());
  for (int64_t r = 0; r < p.shape.rows; ++r) {
    double ms = 0;
    for (int64_t k = 0; k < N; ++k) ms += p.x[r * N + k] * p.x[r * N + k] / N;
    for (int64_t i = 0; i < N; ++i) {
      double v = p.x[r * N + i] / std::sqrt(ms + p.eps);
      if (!p.weight.empty()) v *= p.weight[i];
      if (!p.g.empty()) {
        double const g = p.g[r * N + i], s = 1 / (1 + std::exp(-g));
        v *= p.activation == GateActivation::kSilu ? g * s : s;
      }
      y[r * N + i] = v;
    }
  }
  return y;
}

struct Case {
  bool gated, weighted;
  GateActivation activation;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool gated : {false, true}) {
    for (bool weighted : {false, true}) {
      for (GateActivation a : {GateActivation::kSilu, GateActivation::kSigmoid}) {
        out.push_back({gated, weighted, a});
      }
    }
  }
  return out;
}

std::string name(Case const& c) {
  return std::string(c.gated ? "gated" : "plain") + (c.weighted ? ", weight" : "") +
         (c.activation == GateActivation::kSilu ? ", silu" : ", sigmoid");
}

TEST(NormReference, ForwardMatchesFormula) {
  uint64_t seed = 1;
  for (Case const& c : cases()) {
    Problem const p = random_problem(5, 12, c.gated, c.weighted, c.activation, seed += 10);
    Forward const f = forward(p);
    SCOPED_TRACE(name(c));
    EXPECT_LT(rel_error(f.y, direct_forward(p)), 1e-14);
    for (int64_t r = 0; r < 5; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < 12; ++i) ss += p.x[r * 12 + i] * p.x[r * 12 + i];
      EXPECT_NEAR(f.rstd[r], 1 / std::sqrt(ss / 12 + p.eps), 1e-14 * f.rstd[r]);
    }
  }
}

TEST(NormReference, ZeroRowGivesOneOverSqrtEps) {
  Problem p = random_problem(2, 8, true, true, GateActivation::kSilu, 3);
  for (int64_t i = 0; i < 8; ++i) p.x[8 + i] = 0.0;
  p.eps = 1e-6;
  Forward const f = forward(p);
  EXPECT_DOUBLE_EQ(f.rstd[1], 1e3);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(f.y[8 + i], 0.0);
}

// loss = <y, r>; its gradient is the backward with dy = r, at the forward's rstd.
TEST(NormReference, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 1000;
  for (Case const& c : cases()) {
    Problem p = random_problem(4, 10, c.gated, c.weighted, c.activation, seed += 10);
    int64_t const size = 4 * 10;
    Vec const r = random_vector(size, seed + 5);
    Vec dx(size, NAN), dg(size, NAN), dw(10, NAN);
    Forward const f = forward(p);
    cake::ref::rms_norm_backward(
        p.shape, p.inputs(), f.rstd.data(), r.data(),
        {dx.data(), c.gated ? dg.data() : nullptr, c.weighted ? dw.data() : nullptr});
    auto loss = [&] { return dot(forward(p).y, r); };
    auto check = [&](char const* what, Vec& input, Vec const& grad) {
      SCOPED_TRACE(std::string(what) + ", " + name(c));
      EXPECT_LT(rel_error(grad, finite_difference_gradient(input, loss)), 1e-7);
    };
    check("dx", p.x, dx);
    if (c.gated) check("dg", p.g, dg);
    if (c.weighted) check("dweight", p.weight, dw);
  }
}

// The C ABI on CPU tensors of shape [2, 3, N]: the reference behind it, no workspace, and
// failures that name the argument, the expected and the actual value.
struct AbiCall {
  Problem p = random_problem(6, 8, true, true, GateActivation::kSigmoid, 77);
  Vec y = Vec(48, NAN), rstd = Vec(6, NAN), dy = random_vector(48, 78);
  Vec dx = Vec(48, NAN), dg = Vec(48, NAN), dw = Vec(8, NAN);

  static cakeTensor_t view(Vec& v, std::vector<int64_t> const& shape) {
    return cake::dense_view(v.data(), cakeFloat64, cakeCPU, shape);
  }
  cakeRmsNormForwardArgs_t forward_args() {
    cakeRmsNormForwardArgs_t a{};
    a.struct_size = sizeof a;
    a.activation = cakeActivationSigmoid;
    a.eps = p.eps;
    a.x = view(p.x, {2, 3, 8});
    a.g = view(p.g, {2, 3, 8});
    a.weight = view(p.weight, {8});
    a.y = view(y, {2, 3, 8});
    a.rstd = view(rstd, {6});
    return a;
  }
  cakeRmsNormBackwardArgs_t backward_args() {
    cakeRmsNormBackwardArgs_t a{};
    a.struct_size = sizeof a;
    a.activation = cakeActivationSigmoid;
    a.x = view(p.x, {2, 3, 8});
    a.g = view(p.g, {2, 3, 8});
    a.weight = view(p.weight, {8});
    a.rstd = view(rstd, {6});
    a.dy = view(dy, {2, 3, 8});
    a.dx = view(dx, {2, 3, 8});
    a.dg = view(dg, {2, 3, 8});
    a.dweight = view(dw, {8});
    return a;
  }
};

TEST(NormAbi, CpuForwardAndBackwardRunTheReference) {
  AbiCall c;
  cakeRmsNormForwardArgs_t const fa = c.forward_args();
  ASSERT_EQ(cakeRmsNormForward(&fa, nullptr), cakeSuccess) << cakeGetLastError();
  Forward const f = forward(c.p);
  EXPECT_EQ(c.y, f.y);
  EXPECT_EQ(c.rstd, f.rstd);
  cakeRmsNormBackwardArgs_t const ba = c.backward_args();
  size_t bytes = 1;
  ASSERT_EQ(cakeRmsNormBackwardWorkspaceSize(&ba, &bytes), cakeSuccess) << cakeGetLastError();
  EXPECT_EQ(bytes, 0u);
  ASSERT_EQ(cakeRmsNormBackward(&ba, nullptr, 0, nullptr), cakeSuccess) << cakeGetLastError();
  Vec dx(48), dg(48), dw(8);
  cake::ref::rms_norm_backward(c.p.shape, c.p.inputs(), f.rstd.data(), c.dy.data(),
                               {dx.data(), dg.data(), dw.data()});
  EXPECT_EQ(c.dx, dx);
  EXPECT_EQ(c.dg, dg);
  EXPECT_EQ(c.dw, dw);
}

TEST(NormAbi, ForwardErrorsNameTheArgument) {
  AbiCall c;
  Vec short_weight(7), wide(6 * 9), rstd5(5);
  auto expect = [](cakeRmsNormForwardArgs_t const& a, cakeResult_t code, char const* message) {
    EXPECT_EQ(cakeRmsNormForward(&a, nullptr), code);
    EXPECT_STREQ(cakeGetLastError(), message);
  };
  cakeRmsNormForwardArgs_t a = c.forward_args();
  a.weight = AbiCall::view(short_weight, {7});
  expect(a, cakeInvalidArgument, "weight must have shape [N] = [8], got [7]");
  a = c.forward_args();
  a.g = AbiCall::view(wide, {2, 3, 9});
  expect(a, cakeInvalidArgument, "g must have shape x's = [2, 3, 8], got [2, 3, 9]");
  a = c.forward_args();
  a.rstd = AbiCall::view(rstd5, {5});
  expect(a, cakeInvalidArgument, "rstd must have shape [rows] = [6], got [5]");
  a = c.forward_args();
  a.activation = cakeActivationNone;
  expect(a, cakeInvalidArgument,
         "activation must be cakeActivationSilu (1) or cakeActivationSigmoid (2) with g, got 0");
  a = c.forward_args();
  a.eps = -1;
  expect(a, cakeInvalidArgument, "eps must be finite and >= 0, got -1");
  a = c.forward_args();
  a.x.dtype = cakeInt32;
  expect(a, cakeInvalidArgument,
         "x must be a float tensor (float16, bfloat16, float32 or float64), got int32");
  a = c.forward_args();
  a.weight.device_type = cakeCUDA;
  expect(a, cakeInvalidArgument, "weight must be on x's device (cpu), got cuda:0");
  // Without a gate no activation is needed.
  a = c.forward_args();
  a.g = {};
  a.activation = cakeActivationNone;
  EXPECT_EQ(cakeRmsNormForward(&a, nullptr), cakeSuccess) << cakeGetLastError();
}

TEST(NormAbi, BackwardErrorsNameTheArgument) {
  AbiCall c;
  Vec dw9(9);
  auto expect = [](cakeRmsNormBackwardArgs_t const& a, char const* message) {
    EXPECT_EQ(cakeRmsNormBackward(&a, nullptr, 0, nullptr), cakeInvalidArgument);
    EXPECT_STREQ(cakeGetLastError(), message);
  };
  cakeRmsNormBackwardArgs_t a = c.backward_args();
  a.dweight = AbiCall::view(dw9, {9});
  expect(a, "dweight must have shape [N] (as weight) = [8], got [9]");
  a = c.backward_args();
  a.g = {};
  a.activation = cakeActivationSilu;
  expect(a, "dg can only be computed with a gate g");
  a = c.backward_args();
  a.rstd = {};
  expect(a, "rstd is required but was not given");
}

// In-place calls are refused by the runs; the workspace query, which may take placeholder data
// pointers, is not.
TEST(NormAbi, OutputsSharingMemoryAreRefused) {
  AbiCall c;
  cakeRmsNormForwardArgs_t fa = c.forward_args();
  fa.y = fa.x;
  EXPECT_EQ(cakeRmsNormForward(&fa, nullptr), cakeInvalidArgument);
  EXPECT_STREQ(cakeGetLastError(),
               "y must not share memory with x (the kernels read their inputs while they write "
               "their outputs; in-place calls are not supported): pass a separate tensor");
  cakeRmsNormBackwardArgs_t ba = c.backward_args();
  ba.dx = ba.dy;
  size_t bytes = 1;
  EXPECT_EQ(cakeRmsNormBackwardWorkspaceSize(&ba, &bytes), cakeSuccess) << cakeGetLastError();
  EXPECT_EQ(cakeRmsNormBackward(&ba, nullptr, 0, nullptr), cakeInvalidArgument);
  EXPECT_NE(std::string(cakeGetLastError()).find("dx must not share memory with dy"),
            std::string::npos)
      << cakeGetLastError();
  ba = c.backward_args();
  ba.dg = ba.dx;
  EXPECT_EQ(cakeRmsNormBackward(&ba, nullptr, 0, nullptr), cakeInvalidArgument);
  EXPECT_NE(std::string(cakeGetLastError()).find("dg must not share memory with dx"),
            std::string::npos)
      << cakeGetLastError();
}

// What CUDA would refuse, asked on CPU tensors (no GPU needed): N and dtypes.
TEST(NormAbi, CudaSupportRules) {
  AbiCall c;
  cakeRmsNormForwardArgs_t a = c.forward_args();
  EXPECT_EQ(cakeRmsNormCheckSupport(&a, cakeCPU), cakeSuccess) << cakeGetLastError();
  EXPECT_EQ(cakeRmsNormCheckSupport(&a, cakeCUDA), cakeInvalidArgument);
  EXPECT_STREQ(cakeGetLastError(),
               "x must be bfloat16, float16 or float32 for the CUDA kernels, got float64");
  Vec x12(24), y12(24), r(2);
  a = {};
  a.struct_size = sizeof a;
  a.x = cake::dense_view(x12.data(), cakeFloat32, cakeCPU, {2, 12});
  a.y = cake::dense_view(y12.data(), cakeFloat32, cakeCPU, {2, 12});
  a.rstd = cake::dense_view(r.data(), cakeFloat32, cakeCPU, {2});
  EXPECT_EQ(cakeRmsNormCheckSupport(&a, cakeCUDA), cakeNotSupported);
  EXPECT_STREQ(cakeGetLastError(),
               "the CUDA kernels support rows of N values with N a multiple of 8 and N <= 1024, "
               "got x's last size N = 12");
}

}  // namespace
