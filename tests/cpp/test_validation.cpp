// The C ABI's validation: result codes and cakeGetLastError() messages of cakeForward,
// cakeBackward and the workspace queries on CPU tensors built from std::vectors, plus happy paths
// whose outputs (poisoned with NaN first) are checked element by element.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "abi_testing.hpp"
#include "cake/cake.h"
#include "core/tensor.hpp"

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A dense row-major CPU view of data with the given shape.
cakeTensor_t view(void* data, cakeDtype_t dtype, std::vector<int64_t> const& shape) {
  return cake::dense_view(data, dtype, cakeCPU, shape);
}

std::string last_error() { return cakeGetLastError(); }

// One small valid problem (GDN or KDA) in float64: B = 1, T = 8, H = 1, HV = 2, K = V = 4, two
// documents. Buffers are large enough for every reshaped view the tests make.
struct Problem {
  static constexpr int64_t B = 1, T = 8, H = 1, HV = 2, K = 4, V = 4, N = 2;
  static constexpr size_t kCap = 4096;

  bool kda;
  std::vector<double> q, k, v, g, beta, h0, o, ht, dout, dht, dq, dk, dv, dg, dbeta, dh0;
  std::vector<int64_t> cu = {0, 3, T};
  cakeOptions_t options{};
  cakeForwardArgs_t fwd{};
  cakeBackwardArgs_t bwd{};

  explicit Problem(bool kda_ = false) : kda(kda_) {
    std::mt19937_64 rng(kda ? 2 : 1);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (auto* x : {&q, &k, &v, &dout, &dht, &h0}) {
      x->resize(kCap);
      for (auto& e : *x) e = normal(rng) * 0.5;
    }
    g.resize(kCap);
    for (auto& e : g) e = -uniform(rng);
    beta.resize(kCap);
    for (auto& e : beta) e = uniform(rng);
    for (auto* x : {&o, &ht, &dq, &dk, &dv, &dg, &dbeta, &dh0}) x->assign(kCap, kNaN);

    options.struct_size = sizeof(cakeOptions_t);
    options.variant = kda ? cakeKda : cakeGdn;
    options.scale = 0.5;

    fwd.q = view(q.data(), cakeFloat64, {B, T, H, K});
    fwd.k = view(k.data(), cakeFloat64, {B, T, H, K});
    fwd.v = view(v.data(), cakeFloat64, {B, T, HV, V});
    fwd.g =
        kda ? view(g.data(), cakeFloat64, {B, T, HV, K}) : view(g.data(), cakeFloat64, {B, T, HV});
    fwd.beta = view(beta.data(), cakeFloat64, {B, T, HV});
    fwd.initial_state = view(h0.data(), cakeFloat64, {N, HV, K, V});
    fwd.cu_seqlens = view(cu.data(), cakeInt64, {N + 1});
    fwd.o = view(o.data(), cakeFloat64, {B, T, HV, V});
    fwd.final_state = view(ht.data(), cakeFloat64, {N, HV, K, V});

    bwd = cake::testing::backward_inputs(fwd);
    bwd.dout = view(dout.data(), cakeFloat64, {B, T, HV, V});
    bwd.dht = view(dht.data(), cakeFloat64, {N, HV, K, V});
    bwd.dq = view(dq.data(), cakeFloat64, {B, T, H, K});
    bwd.dk = view(dk.data(), cakeFloat64, {B, T, H, K});
    bwd.dv = view(dv.data(), cakeFloat64, {B, T, HV, V});
    bwd.dg = kda ? view(dg.data(), cakeFloat64, {B, T, HV, K})
                 : view(dg.data(), cakeFloat64, {B, T, HV});
    bwd.dbeta = view(dbeta.data(), cakeFloat64, {B, T, HV});
    bwd.dh0 = view(dh0.data(), cakeFloat64, {N, HV, K, V});
  }

  cakeResult_t forward() { return cakeForward(&options, &fwd, nullptr, 0, nullptr, 0, nullptr); }
  cakeResult_t backward() { return cakeBackward(&options, &bwd, nullptr, 0, nullptr, 0, nullptr); }
  cakeResult_t forward_size(size_t* bytes) {
    return cakeForwardWorkspaceSize(&options, &fwd, bytes);
  }

  // Sets the same input tensor in the forward and the backward arguments.
  void set(cakeTensor_t cakeForwardArgs_t::*f, cakeTensor_t cakeBackwardArgs_t::*b,
           cakeTensor_t t) {
    fwd.*f = t;
    bwd.*b = t;
  }
};

// Expects the forward (and, for input errors, the backward and the workspace query) to fail with
// `code` and a message containing every string of `parts`.
void expect_error(cakeResult_t result, cakeResult_t code, std::vector<std::string> const& parts) {
  EXPECT_EQ(result, code) << "got " << cakeGetErrorString(result) << ": " << last_error();
  std::string const message = last_error();
  for (auto const& p : parts) {
    EXPECT_NE(message.find(p), std::string::npos)
        << "message \"" << message << "\" lacks \"" << p << "\"";
  }
}

void expect_input_error(Problem& p, cakeResult_t code, std::vector<std::string> const& parts) {
  expect_error(p.forward(), code, parts);
  size_t bytes = 123;
  expect_error(p.forward_size(&bytes), code, parts);
  EXPECT_EQ(bytes, 123u) << "a failed query must not write bytes";
  expect_error(p.backward(), code, parts);
  expect_error(cakeBackwardWorkspaceSize(&p.options, &p.bwd, &bytes), code, parts);
  // Nothing was written.
  for (int64_t i = 0; i < Problem::B * Problem::T * Problem::HV * Problem::V; ++i) {
    ASSERT_TRUE(std::isnan(p.o[i]));
    ASSERT_TRUE(std::isnan(p.dv[i]));
  }
}

// ------------------------------------------------------------------------------------------------
// Options and argument structs
// ------------------------------------------------------------------------------------------------

TEST(Validation, BaselineProblemIsValid) {
  for (bool kda : {false, true}) {
    Problem p(kda);
    EXPECT_EQ(p.forward(), cakeSuccess) << last_error();
    EXPECT_EQ(p.backward(), cakeSuccess) << last_error();
  }
}

TEST(Validation, NullOptions) {
  Problem p;
  expect_error(cakeForward(nullptr, &p.fwd, nullptr, 0, nullptr, 0, nullptr), cakeInvalidArgument,
               {"options must not be NULL"});
  expect_error(cakeBackward(nullptr, &p.bwd, nullptr, 0, nullptr, 0, nullptr), cakeInvalidArgument,
               {"options must not be NULL"});
  size_t bytes = 0;
  expect_error(cakeForwardWorkspaceSize(nullptr, &p.fwd, &bytes), cakeInvalidArgument,
               {"options must not be NULL"});
}

TEST(Validation, NullArgsAndBytes) {
  Problem p;
  expect_error(cakeForward(&p.options, nullptr, nullptr, 0, nullptr, 0, nullptr),
               cakeInvalidArgument, {"args must not be NULL"});
  expect_error(cakeBackward(&p.options, nullptr, nullptr, 0, nullptr, 0, nullptr),
               cakeInvalidArgument, {"args must not be NULL"});
  expect_error(p.forward_size(nullptr), cakeInvalidArgument, {"bytes must not be NULL"});
  expect_error(cakeBackwardWorkspaceSize(&p.options, &p.bwd, nullptr), cakeInvalidArgument,
               {"bytes must not be NULL"});
}

TEST(Validation, WrongStructSize) {
  Problem p;
  p.options.struct_size = sizeof(cakeOptions_t) - 8;
  expect_input_error(p, cakeInvalidArgument,
                     {"options.struct_size", std::to_string(sizeof(cakeOptions_t)),
                      "got " + std::to_string(sizeof(cakeOptions_t) - 8)});
  p.options.struct_size = 0;
  expect_error(p.forward(), cakeInvalidArgument, {"options.struct_size", "got 0"});
}

TEST(Validation, UnknownVariant) {
  Problem p;
  p.options.variant = static_cast<cakeVariant_t>(7);
  expect_input_error(p, cakeInvalidArgument, {"options.variant", "got 7"});
}

TEST(Validation, NonFiniteScale) {
  Problem p;
  p.options.scale = std::numeric_limits<double>::quiet_NaN();
  expect_input_error(p, cakeInvalidArgument, {"scale must be a finite number", "got nan"});
  p.options.scale = std::numeric_limits<double>::infinity();
  expect_input_error(p, cakeInvalidArgument, {"scale must be a finite number", "got inf"});
  p.options.scale = -std::numeric_limits<double>::infinity();
  expect_input_error(p, cakeInvalidArgument, {"scale must be a finite number", "got -inf"});
}

TEST(Validation, AllowNegEigvalNeedsBetaSigmoid) {
  Problem p;
  p.options.allow_neg_eigval = 1;
  expect_input_error(p, cakeInvalidArgument, {"allow_neg_eigval", "use_beta_sigmoid"});
}

TEST(Validation, LowerBound) {
  Problem gdn(false);
  gdn.options.has_lower_bound = 1;
  gdn.options.lower_bound = -1.0;
  expect_input_error(gdn, cakeInvalidArgument, {"lower_bound", "chunk_kda only", "-1"});
  Problem kda(true);
  kda.options.use_gate_in_kernel = 1;
  kda.options.has_lower_bound = 1;
  kda.options.lower_bound = 0.5;
  expect_input_error(kda, cakeInvalidArgument, {"lower_bound must be a finite negative", "0.5"});
  Problem ungated(true);
  ungated.options.has_lower_bound = 1;
  ungated.options.lower_bound = -2.0;
  expect_input_error(ungated, cakeInvalidArgument,
                     {"lower_bound is a form of the in-op gate", "use_gate_in_kernel", "-2"});
}

// ------------------------------------------------------------------------------------------------
// Input tensors
// ------------------------------------------------------------------------------------------------

TEST(Validation, QRank) {
  Problem p;
  p.set(&cakeForwardArgs_t::q, &cakeBackwardArgs_t::q, view(p.q.data(), cakeFloat64, {8, 1, 4}));
  expect_input_error(p, cakeInvalidArgument, {"q must have 4 dimensions", "got shape [8, 1, 4]"});
}

TEST(Validation, MissingQ) {
  Problem p;
  p.set(&cakeForwardArgs_t::q, &cakeBackwardArgs_t::q, cakeTensor_t{});
  expect_input_error(p, cakeInvalidArgument, {"q is required"});
}

TEST(Validation, KShape) {
  Problem p;
  p.set(&cakeForwardArgs_t::k, &cakeBackwardArgs_t::k, view(p.k.data(), cakeFloat64, {1, 8, 1, 5}));
  expect_input_error(p, cakeInvalidArgument,
                     {"k must have shape", "[1, 8, 1, 4]", "got [1, 8, 1, 5]"});
}

TEST(Validation, GShapePerVariant) {
  Problem gdn(false);
  gdn.set(&cakeForwardArgs_t::g, &cakeBackwardArgs_t::g,
          view(gdn.g.data(), cakeFloat64, {1, 8, 2, 4}));
  expect_input_error(gdn, cakeInvalidArgument,
                     {"g must have shape", "[1, 8, 2]", "got [1, 8, 2, 4]"});
  Problem kda(true);
  kda.set(&cakeForwardArgs_t::g, &cakeBackwardArgs_t::g,
          view(kda.g.data(), cakeFloat64, {1, 8, 2}));
  expect_input_error(kda, cakeInvalidArgument,
                     {"g must have shape", "[1, 8, 2, 4]", "got [1, 8, 2]"});
}

TEST(Validation, HeadsNotDividing) {
  Problem p;
  // H = 2 q/k heads, HV = 3 value heads.
  p.set(&cakeForwardArgs_t::q, &cakeBackwardArgs_t::q, view(p.q.data(), cakeFloat64, {1, 8, 2, 4}));
  p.set(&cakeForwardArgs_t::k, &cakeBackwardArgs_t::k, view(p.k.data(), cakeFloat64, {1, 8, 2, 4}));
  p.set(&cakeForwardArgs_t::v, &cakeBackwardArgs_t::v, view(p.v.data(), cakeFloat64, {1, 8, 3, 4}));
  p.set(&cakeForwardArgs_t::g, &cakeBackwardArgs_t::g, view(p.g.data(), cakeFloat64, {1, 8, 3}));
  p.set(&cakeForwardArgs_t::beta, &cakeBackwardArgs_t::beta,
        view(p.beta.data(), cakeFloat64, {1, 8, 3}));
  p.fwd.o = view(p.o.data(), cakeFloat64, {1, 8, 3, 4});
  expect_error(p.forward(), cakeInvalidArgument, {"v.shape[2] = 3", "q.shape[2] = 2", "multiple"});
}

TEST(Validation, IntegerAndMismatchedDtypes) {
  Problem p;
  std::vector<int64_t> ints(4096, 1);
  p.set(&cakeForwardArgs_t::beta, &cakeBackwardArgs_t::beta,
        view(ints.data(), cakeInt64, {1, 8, 2}));
  expect_input_error(p, cakeInvalidArgument, {"beta must be a float tensor", "got int64"});
  Problem m;
  std::vector<float> f32(4096, 0.5f);
  m.set(&cakeForwardArgs_t::k, &cakeBackwardArgs_t::k, view(f32.data(), cakeFloat32, {1, 8, 1, 4}));
  expect_input_error(m, cakeInvalidArgument, {"same dtype", "q float64", "k float32", "v float64"});
}

TEST(Validation, CuSeqlensContents) {
  for (cakeDtype_t dtype : {cakeInt32, cakeInt64}) {
    struct Case {
      std::vector<int64_t> cu;
      std::vector<std::string> parts;
    };
    std::vector<Case> const cases = {
        {{1, 3, 8}, {"cu_seqlens must start at 0", "got 1"}},
        {{0, 5, 3, 8}, {"non-decreasing", "cu_seqlens[1] = 5", "cu_seqlens[2] = 3"}},
        {{0, 3, 7}, {"cu_seqlens must end at the number of tokens T = 8", "got 7"}},
        {{0, 3, 9}, {"T = 8", "got 9"}},
    };
    for (auto const& c : cases) {
      Problem p;
      p.options.scale = 0.5;
      std::vector<int64_t> cu64 = c.cu;
      std::vector<int32_t> cu32(c.cu.begin(), c.cu.end());
      int64_t const n = static_cast<int64_t>(c.cu.size());
      cakeTensor_t cu = dtype == cakeInt32 ? view(cu32.data(), cakeInt32, {n})
                                           : view(cu64.data(), cakeInt64, {n});
      p.set(&cakeForwardArgs_t::cu_seqlens, &cakeBackwardArgs_t::cu_seqlens, cu);
      // States of the right document count, so that only the offsets are wrong.
      std::vector<int64_t> const state = {n - 1, 2, 4, 4};
      p.set(&cakeForwardArgs_t::initial_state, &cakeBackwardArgs_t::initial_state,
            view(p.h0.data(), cakeFloat64, state));
      p.fwd.final_state = view(p.ht.data(), cakeFloat64, state);
      p.bwd.dht = view(p.dht.data(), cakeFloat64, state);
      p.bwd.dh0 = view(p.dh0.data(), cakeFloat64, state);
      expect_input_error(p, cakeInvalidArgument, c.parts);
    }
  }
}

TEST(Validation, CuSeqlensDtypeAndShape) {
  Problem p;
  std::vector<double> f = {0, 3, 8};
  p.set(&cakeForwardArgs_t::cu_seqlens, &cakeBackwardArgs_t::cu_seqlens,
        view(f.data(), cakeFloat64, {3}));
  expect_input_error(p, cakeInvalidArgument, {"cu_seqlens must be int32 or int64", "got float64"});
  Problem q;
  q.set(&cakeForwardArgs_t::cu_seqlens, &cakeBackwardArgs_t::cu_seqlens,
        view(q.cu.data(), cakeInt64, {1, 3}));
  expect_input_error(q, cakeInvalidArgument,
                     {"cu_seqlens must have shape [N + 1]", "got shape [1, 3]"});
}

TEST(Validation, BatchWithCuSeqlens) {
  Problem p;
  // B = 2 rows of T = 4 tokens, with cu_seqlens.
  p.set(&cakeForwardArgs_t::q, &cakeBackwardArgs_t::q, view(p.q.data(), cakeFloat64, {2, 4, 1, 4}));
  p.set(&cakeForwardArgs_t::k, &cakeBackwardArgs_t::k, view(p.k.data(), cakeFloat64, {2, 4, 1, 4}));
  p.set(&cakeForwardArgs_t::v, &cakeBackwardArgs_t::v, view(p.v.data(), cakeFloat64, {2, 4, 2, 4}));
  p.set(&cakeForwardArgs_t::g, &cakeBackwardArgs_t::g, view(p.g.data(), cakeFloat64, {2, 4, 2}));
  p.set(&cakeForwardArgs_t::beta, &cakeBackwardArgs_t::beta,
        view(p.beta.data(), cakeFloat64, {2, 4, 2}));
  p.fwd.o = view(p.o.data(), cakeFloat64, {2, 4, 2, 4});
  expect_error(p.forward(), cakeInvalidArgument, {"batch size B must be 1", "got B = 2"});
}

TEST(Validation, InitialStateShape) {
  Problem p;
  p.set(&cakeForwardArgs_t::initial_state, &cakeBackwardArgs_t::initial_state,
        view(p.h0.data(), cakeFloat64, {1, 2, 4, 4}));
  expect_input_error(p, cakeInvalidArgument,
                     {"initial_state must have shape", "[2, 2, 4, 4]", "got [1, 2, 4, 4]"});
}

TEST(Validation, GateParameters) {
  Problem p;
  p.options.use_gate_in_kernel = 1;
  expect_input_error(p, cakeInvalidArgument, {"A_log", "required", "use_gate_in_kernel"});
  std::vector<double> a_log(8, 0.1);
  Problem q;
  q.set(&cakeForwardArgs_t::A_log, &cakeBackwardArgs_t::A_log,
        view(a_log.data(), cakeFloat64, {2}));
  expect_input_error(q, cakeInvalidArgument, {"A_log", "only used with use_gate_in_kernel=True"});
  Problem kda(true);
  kda.options.use_gate_in_kernel = 1;
  kda.set(&cakeForwardArgs_t::A_log, &cakeBackwardArgs_t::A_log,
          view(a_log.data(), cakeFloat64, {2}));
  kda.set(&cakeForwardArgs_t::dt_bias, &cakeBackwardArgs_t::dt_bias,
          view(a_log.data(), cakeFloat64, {2}));
  expect_input_error(kda, cakeInvalidArgument,
                     {"dt_bias must have shape [HV * K] = [8]", "got [2]"});
}

TEST(Validation, HeadDimTooLargeOnCpu) {
  Problem p;
  std::vector<double> big(8 * 300 * 2, 0.0);
  p.set(&cakeForwardArgs_t::v, &cakeBackwardArgs_t::v,
        view(big.data(), cakeFloat64, {1, 8, 2, 300}));
  std::vector<double> o(8 * 300 * 2, kNaN);
  p.fwd.o = view(o.data(), cakeFloat64, {1, 8, 2, 300});
  p.fwd.initial_state = cakeTensor_t{};
  p.fwd.final_state = cakeTensor_t{};
  expect_error(p.forward(), cakeNotSupported, {"head dims", "[1, 256]", "V = 300"});
}

TEST(Validation, UnknownDeviceType) {
  Problem p;
  p.fwd.q.device_type = 9;
  expect_error(p.forward(), cakeInvalidArgument, {"q must be on the CPU or a CUDA device"});
}

TEST(Validation, MixedDevices) {
  Problem p;
  p.fwd.g.device_type = cakeCUDA;
  expect_error(p.forward(), cakeInvalidArgument, {"g must be on q's device (cpu)", "got cuda:0"});
  Problem q;
  q.fwd.initial_state.device_id = 1;  // cpu:1 is not q's cpu:0
  expect_error(q.forward(), cakeInvalidArgument, {"initial_state must be on q's device"});
}

// ------------------------------------------------------------------------------------------------
// Outputs and gradients
// ------------------------------------------------------------------------------------------------

TEST(Validation, MissingO) {
  Problem p;
  p.fwd.o = cakeTensor_t{};
  expect_error(p.forward(), cakeInvalidArgument, {"o is required"});
  size_t bytes = 0;
  expect_error(p.forward_size(&bytes), cakeInvalidArgument, {"o is required"});
}

TEST(Validation, WrongShapeO) {
  Problem p;
  p.fwd.o = view(p.o.data(), cakeFloat64, {1, 8, 2, 5});
  expect_error(p.forward(), cakeInvalidArgument,
               {"o must have shape", "[1, 8, 2, 4]", "got [1, 8, 2, 5]"});
}

TEST(Validation, NonContiguousO) {
  Problem p;
  std::swap(p.fwd.o.strides[2], p.fwd.o.strides[3]);  // [B, T, HV, V] with transposed strides
  expect_error(p.forward(), cakeInvalidArgument, {"o must be contiguous", "[1, 8, 2, 4]"});
  EXPECT_TRUE(std::isnan(p.o[0])) << "o written although the call failed";
}

TEST(Validation, FinalStateShape) {
  Problem p;
  p.fwd.final_state = view(p.ht.data(), cakeFloat64, {2, 2, 4, 5});
  expect_error(p.forward(), cakeInvalidArgument,
               {"final_state must have shape", "got [2, 2, 4, 5]"});
}

TEST(Validation, IntegerOutput) {
  Problem p;
  std::vector<int64_t> ints(4096, 0);
  p.fwd.o = view(ints.data(), cakeInt64, {1, 8, 2, 4});
  expect_error(p.forward(), cakeInvalidArgument, {"o must be a float tensor", "got int64"});
}

TEST(Validation, BackwardGradients) {
  Problem p;
  p.bwd.dout = cakeTensor_t{};
  expect_error(p.backward(), cakeInvalidArgument, {"dout is required"});

  Problem q;
  q.bwd.initial_state = cakeTensor_t{};  // dh0 requested without an initial state
  expect_error(q.backward(), cakeInvalidArgument,
               {"dh0 can only be computed with an initial_state"});

  Problem r;
  std::vector<double> d(8, 0.0);
  r.bwd.dA_log = view(d.data(), cakeFloat64, {2});
  expect_error(r.backward(), cakeInvalidArgument, {"dA_log can only be computed with A_log"});

  Problem s;
  s.bwd.dq = view(s.dq.data(), cakeFloat64, {1, 8, 1, 5});
  expect_error(s.backward(), cakeInvalidArgument, {"dq must have shape", "got [1, 8, 1, 5]"});

  Problem t;
  std::swap(t.bwd.dv.strides[2], t.bwd.dv.strides[3]);
  expect_error(t.backward(), cakeInvalidArgument, {"dv must be contiguous"});
}

// An output over an input, over part of one, or over another output is refused by the runs; the
// size queries (placeholder data pointers allowed) still answer. Adjacent buffers are fine.
TEST(Validation, OutputsMustNotShareMemory) {
  for (bool kda : {false, true}) {
    Problem p(kda);
    p.fwd.o = view(p.v.data(), cakeFloat64, {1, 8, 2, 4});
    size_t bytes = 0;
    EXPECT_EQ(p.forward_size(&bytes), cakeSuccess) << last_error();
    expect_error(p.forward(), cakeInvalidArgument, {"o must not share memory with v", "in-place"});

    Problem q(kda);  // o's first element on q's last one ([1, 8, 1, 4]: 32 elements)
    q.fwd.o = view(q.q.data() + 31, cakeFloat64, {1, 8, 2, 4});
    expect_error(q.forward(), cakeInvalidArgument, {"o must not share memory with q"});
    q.fwd.o = view(q.q.data() + 32, cakeFloat64, {1, 8, 2, 4});
    EXPECT_EQ(q.forward(), cakeSuccess) << last_error();

    Problem r(kda);
    r.fwd.final_state = view(r.o.data(), cakeFloat64, {2, 2, 4, 4});
    expect_error(r.forward(), cakeInvalidArgument, {"final_state must not share memory with o"});

    Problem s(kda);
    s.bwd.dv = view(s.dout.data(), cakeFloat64, {1, 8, 2, 4});
    EXPECT_EQ(cakeBackwardWorkspaceSize(&s.options, &s.bwd, &bytes), cakeSuccess) << last_error();
    expect_error(s.backward(), cakeInvalidArgument, {"dv must not share memory with dout"});
    EXPECT_TRUE(std::isnan(s.dq[0])) << "dq written although the call failed";

    Problem t(kda);
    t.bwd.dk = t.bwd.dq;
    expect_error(t.backward(), cakeInvalidArgument, {"dk must not share memory with dq"});
  }
}

// ------------------------------------------------------------------------------------------------
// CUDA tensors
// ------------------------------------------------------------------------------------------------

// Every tensor of p marked as on cuda:0 (the data stay host pointers: only calls that fail
// before touching data may be made with them).
void on_cuda(Problem& p) {
  for (auto* t : {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.g, &p.fwd.beta, &p.fwd.initial_state,
                  &p.fwd.cu_seqlens, &p.fwd.o, &p.fwd.final_state}) {
    t->device_type = cakeCUDA;
  }
}

TEST(Validation, CudaHeadDims) {
  Problem p;
  on_cuda(p);
  expect_error(p.forward(), cakeNotSupported, {"K = V = 128", "got K = 4, V = 4"});
}

// KDA on CUDA tensors meets the same rules as GDN (its kernels read bfloat16 q, k, v).
TEST(Validation, CudaKdaChecksTheKernelsRules) {
  Problem p(true);
  std::vector<double> big(8 * 2 * 128 * 128, 0.0);
  p.fwd.q = view(big.data(), cakeFloat64, {1, 8, 1, 128});
  p.fwd.k = p.fwd.q;
  p.fwd.v = view(big.data(), cakeFloat64, {1, 8, 2, 128});
  p.fwd.g = view(big.data(), cakeFloat64, {1, 8, 2, 128});
  p.fwd.o = view(big.data(), cakeFloat64, {1, 8, 2, 128});
  p.fwd.initial_state = view(big.data(), cakeFloat64, {2, 2, 128, 128});
  p.fwd.final_state = cakeTensor_t{};
  on_cuda(p);
  expect_error(p.forward(), cakeInvalidArgument, {"q must be bfloat16", "got float64"});
}

TEST(Validation, CudaTensorsInBuildWithoutCuda) {
  // A valid GDN problem on cuda:0 (bf16 q/k/v/o, float32 g/beta/states, int32 offsets).
  constexpr int64_t T = 64, HV = 1, D = 128;
  std::vector<uint16_t> qk(T * D, 0), vo(T * HV * D, 0), o(T * HV * D, 0);
  std::vector<float> g(T * HV, -0.1f), beta(T * HV, 0.5f);
  std::vector<int32_t> cu = {0, T};
  cakeOptions_t options{};
  options.struct_size = sizeof(cakeOptions_t);
  options.variant = cakeGdn;
  options.scale = 1.0 / std::sqrt(128.0);
  cakeForwardArgs_t args{};
  args.q = view(qk.data(), cakeBfloat16, {1, T, 1, D});
  args.k = args.q;
  args.v = view(vo.data(), cakeBfloat16, {1, T, HV, D});
  args.g = view(g.data(), cakeFloat32, {1, T, HV});
  args.beta = view(beta.data(), cakeFloat32, {1, T, HV});
  args.cu_seqlens = view(cu.data(), cakeInt32, {2});
  args.o = view(o.data(), cakeBfloat16, {1, T, HV, D});
  for (auto* t : {&args.q, &args.k, &args.v, &args.g, &args.beta, &args.cu_seqlens, &args.o}) {
    t->device_type = cakeCUDA;
  }
  size_t bytes = 0;
  cakeResult_t const r = cakeForwardWorkspaceSize(&options, &args, &bytes);
  if (r != cakeNotImplemented) {
    // A build with CUDA: the problem is valid; the data are host pointers, so stop here.
    EXPECT_EQ(r, cakeSuccess) << last_error();
    GTEST_SKIP() << "this build has CUDA";
  }
  EXPECT_NE(last_error().find("without CUDA"), std::string::npos) << last_error();
  expect_error(cakeForward(&options, &args, nullptr, 0, nullptr, 0, nullptr), cakeNotImplemented,
               {"without CUDA"});
}

// ------------------------------------------------------------------------------------------------
// Saved, inverse and recompute modes (options.save_for_backward, the saved buffer)
// ------------------------------------------------------------------------------------------------

TEST(Validation, SaveForBackwardMustBeZeroOneOrTwo) {
  for (int32_t bad : {3, -1}) {
    Problem p;
    p.options.save_for_backward = bad;
    std::string const got = "got " + std::to_string(bad);
    expect_input_error(p, cakeInvalidArgument, {"options.save_for_backward", "0", "1", "2", got});
    size_t bytes = 123;
    expect_error(cakeForwardSavedSize(&p.options, &p.fwd, &bytes), cakeInvalidArgument,
                 {"options.save_for_backward", got});
    EXPECT_EQ(bytes, 123u);
  }
}

TEST(Validation, SavedSizeIsZeroOnTheCpu) {
  for (bool kda : {false, true}) {
    for (int32_t save : {0, 1, 2}) {
      Problem p(kda);
      p.options.save_for_backward = save;
      size_t bytes = 123;
      ASSERT_EQ(cakeForwardSavedSize(&p.options, &p.fwd, &bytes), cakeSuccess) << last_error();
      EXPECT_EQ(bytes, 0u) << "the CPU reference always recomputes";
      ASSERT_EQ(cakeForwardWorkspaceSize(&p.options, &p.fwd, &bytes), cakeSuccess);
      EXPECT_EQ(bytes, 0u);
    }
  }
  Problem p;
  expect_error(cakeForwardSavedSize(&p.options, &p.fwd, nullptr), cakeInvalidArgument,
               {"bytes must not be NULL"});
  expect_error(cakeForwardSavedSize(nullptr, &p.fwd, nullptr), cakeInvalidArgument,
               {"must not be NULL"});
}

TEST(Validation, RecomputeModeTakesNoSavedBuffer) {
  Problem p;
  double buffer[4] = {};
  expect_error(cakeForward(&p.options, &p.fwd, buffer, sizeof buffer, nullptr, 0, nullptr),
               cakeInvalidArgument,
               {"saved must be NULL in recompute mode", "options.save_for_backward = 0", "32"});
  expect_error(cakeBackward(&p.options, &p.bwd, buffer, sizeof buffer, nullptr, 0, nullptr),
               cakeInvalidArgument, {"saved must be NULL in recompute mode"});
  for (int64_t i = 0; i < Problem::B * Problem::T * Problem::HV * Problem::V; ++i) {
    ASSERT_TRUE(std::isnan(p.o[i]));
    ASSERT_TRUE(std::isnan(p.dv[i]));
  }
}

TEST(Validation, NullSavedBufferWithBytes) {
  for (int32_t save : {0, 1, 2}) {
    Problem p;
    p.options.save_for_backward = save;
    expect_error(cakeForward(&p.options, &p.fwd, nullptr, 64, nullptr, 0, nullptr),
                 cakeInvalidArgument, {"saved is NULL but saved_bytes = 64"});
    expect_error(cakeBackward(&p.options, &p.bwd, nullptr, 64, nullptr, 0, nullptr),
                 cakeInvalidArgument, {"saved is NULL but saved_bytes = 64"});
  }
}

// On the CPU every mode runs the same reference: saved and inverse modes accept a NULL (0-byte)
// saved set, or any buffer, and give the same results as recompute mode.
TEST(Validation, SavedModeOnTheCpuEqualsRecomputeMode) {
  for (bool kda : {false, true}) {
    Problem recompute(kda);
    ASSERT_EQ(recompute.forward(), cakeSuccess) << last_error();
    ASSERT_EQ(recompute.backward(), cakeSuccess) << last_error();
    for (int32_t mode : {1, 2}) {
      Problem saved(kda);
      saved.options.save_for_backward = mode;
      ASSERT_EQ(saved.forward(), cakeSuccess) << last_error();
      ASSERT_EQ(saved.backward(), cakeSuccess) << last_error();
      double spare[8] = {};
      EXPECT_EQ(cakeForward(&saved.options, &saved.fwd, spare, sizeof spare, nullptr, 0, nullptr),
                cakeSuccess)
          << last_error();
      for (size_t i = 0; i < Problem::kCap; ++i) {
        for (auto [a, b] : {std::pair{&recompute.o, &saved.o},
                            {&recompute.ht, &saved.ht},
                            {&recompute.dq, &saved.dq},
                            {&recompute.dk, &saved.dk},
                            {&recompute.dv, &saved.dv},
                            {&recompute.dg, &saved.dg},
                            {&recompute.dbeta, &saved.dbeta},
                            {&recompute.dh0, &saved.dh0}}) {
          double const x = (*a)[i], y = (*b)[i];
          ASSERT_TRUE((std::isnan(x) && std::isnan(y)) || x == y)
              << "mode " << mode << ", element " << i;
        }
      }
    }
  }
}

// A valid GDN problem on cuda:0 whose data are host placeholders: only the queries and the
// argument checks that run before any device work may be called on it.
struct CudaShapes {
  static constexpr int64_t T = 130, H = 1, HV = 2, D = 128;
  std::vector<uint16_t> qk = std::vector<uint16_t>(T * H * D);
  std::vector<uint16_t> vo = std::vector<uint16_t>(T * HV * D);
  std::vector<uint16_t> o = std::vector<uint16_t>(T * HV * D);  // outputs apart from the inputs
  std::vector<uint16_t> dv = std::vector<uint16_t>(T * HV * D);
  std::vector<float> row = std::vector<float>(T * HV);
  std::vector<int32_t> cu = {0, T};
  cakeOptions_t options{};
  cakeForwardArgs_t fwd{};
  cakeBackwardArgs_t bwd{};

  CudaShapes() {
    options.struct_size = sizeof(cakeOptions_t);
    options.variant = cakeGdn;
    options.scale = 1.0 / std::sqrt(128.0);
    options.use_qk_l2norm = 1;
    fwd.q = view(qk.data(), cakeBfloat16, {1, T, H, D});
    fwd.k = fwd.q;
    fwd.v = view(vo.data(), cakeBfloat16, {1, T, HV, D});
    fwd.g = view(row.data(), cakeFloat32, {1, T, HV});
    fwd.beta = fwd.g;
    fwd.cu_seqlens = view(cu.data(), cakeInt32, {2});
    fwd.o = view(o.data(), cakeBfloat16, {1, T, HV, D});
    for (auto* t : {&fwd.q, &fwd.k, &fwd.v, &fwd.g, &fwd.beta, &fwd.cu_seqlens, &fwd.o}) {
      t->device_type = cakeCUDA;
    }
    bwd = cake::testing::backward_inputs(fwd);
    bwd.dout = fwd.v;
    bwd.dv = view(dv.data(), cakeBfloat16, {1, T, HV, D});
    bwd.dv.device_type = cakeCUDA;
  }
};

TEST(Validation, SavedSetOnCudaTensors) {
  CudaShapes c;
  size_t bytes = 0;
  if (cakeForwardSavedSize(&c.options, &c.fwd, &bytes) == cakeNotImplemented) {
    GTEST_SKIP() << "this build has no CUDA: " << last_error();
  }
  EXPECT_EQ(bytes, 0u) << "recompute mode saves nothing";
  size_t fws_recompute = 0, bws_recompute = 0;
  ASSERT_EQ(cakeForwardWorkspaceSize(&c.options, &c.fwd, &fws_recompute), cakeSuccess);
  ASSERT_EQ(cakeBackwardWorkspaceSize(&c.options, &c.bwd, &bws_recompute), cakeSuccess);

  c.options.save_for_backward = 1;
  size_t saved = 0, fws = 0, bws = 0;
  ASSERT_EQ(cakeForwardSavedSize(&c.options, &c.fwd, &saved), cakeSuccess) << last_error();
  ASSERT_EQ(cakeForwardWorkspaceSize(&c.options, &c.fwd, &fws), cakeSuccess);
  ASSERT_EQ(cakeBackwardWorkspaceSize(&c.options, &c.bwd, &bws), cakeSuccess);
  // The saved set as docs/design/gdn-hopper.md lists it, each region 256-byte aligned, no slack:
  // normalised q and k (bf16 [BT, H, K]) and their rows' rstd (fp32 [BT, H]), G (fp32 [BT, HV]),
  // A (bf16 [BT, HV, 64]), beta (fp32 [BT, HV]) and h (bf16 [num_slots = BT / 64 + N + 1 = 4, HV,
  // 128, 128]).
  auto const up = [](size_t n) { return (n + 255) / 256 * 256; };
  size_t const bt = CudaShapes::T, hv = CudaShapes::HV, d = CudaShapes::D, h = CudaShapes::H;
  size_t const qk_norm = up(bt * h * d * 2) * 2 + up(bt * h * 4) * 2;
  size_t const expected =
      qk_norm + up(bt * hv * 4) + up(bt * hv * 64 * 2) + up(bt * hv * 4) + 4 * hv * d * d * 2;
  EXPECT_EQ(saved, expected);
  // The forward's scratch (each region 256-byte aligned, plus 256 bytes of slack for any base):
  // q and k normalised with their rstd, G, A and beta in recompute mode; nothing but the slack in
  // saved mode, whose saved set moves to `saved`. The backward's scratch loses the recompute.
  EXPECT_EQ(fws_recompute, qk_norm + up(bt * hv * 4) + up(bt * hv * 64 * 2) + bt * hv * 4 + 256);
  EXPECT_EQ(fws, 256u);
  EXPECT_LT(bws, bws_recompute);

  // The buffer checks run before any device work (the data here are host placeholders).
  expect_error(cakeForward(&c.options, &c.fwd, nullptr, 0, nullptr, 0, nullptr),
               cakeInsufficientWorkspace,
               {"saved: expected at least " + std::to_string(saved) + " bytes", "got 0"});
  std::vector<char> host(saved + 256);
  expect_error(cakeBackward(&c.options, &c.bwd, host.data(), saved - 1, nullptr, 0, nullptr),
               cakeInsufficientWorkspace,
               {"saved: expected at least " + std::to_string(saved), std::to_string(saved - 1)});
  // Enough saved bytes, too little workspace: the workspace check names the workspace.
  void* aligned = host.data() + (256 - reinterpret_cast<uintptr_t>(host.data()) % 256) % 256;
  expect_error(cakeForward(&c.options, &c.fwd, aligned, saved, nullptr, 0, nullptr),
               cakeInsufficientWorkspace, {"workspace: expected at least", std::to_string(fws)});
  // A misaligned saved set: its layout would depend on its address.
  std::vector<char> scratch(fws);
  void* misaligned = static_cast<char*>(aligned) + 16;
  expect_error(cakeForward(&c.options, &c.fwd, misaligned, saved, scratch.data(), fws, nullptr),
               cakeInvalidArgument, {"saved must be 256-byte aligned"});
  // A NULL workspace that claims bytes: every buffer carved from it would be null.
  expect_error(cakeForward(&c.options, &c.fwd, aligned, saved, nullptr, fws, nullptr),
               cakeInvalidArgument,
               {"workspace is NULL but workspace_bytes = " + std::to_string(fws)});
  // States 4 bytes off an 8-byte boundary: the walks move them two floats at a time.
  std::vector<float> states(CudaShapes::HV * 128 * 128 + 1);
  bool const even = reinterpret_cast<uintptr_t>(states.data()) % 8 == 0;
  cakeForwardArgs_t odd_h0 = c.fwd;
  odd_h0.initial_state =
      view(states.data() + (even ? 1 : 0), cakeFloat32, {1, CudaShapes::HV, 128, 128});
  odd_h0.initial_state.device_type = cakeCUDA;
  expect_error(cakeForward(&c.options, &odd_h0, aligned, saved, scratch.data(), fws, nullptr),
               cakeNotSupported, {"initial_state must be 8-byte aligned"});

  // Inverse mode: the saved set is all but h (q and k normalised with their rstd, G, A, beta);
  // the forward's scratch is the slack. The backward's scratch holds what it reruns (h, and the
  // h-walk's flags: N x HV ints), dq and dk summed over the value heads and walk_a_bwd's ticket
  // and turns (1 + 2 num_slots H ints), not G, A, beta nor q̂, k̂.
  c.options.save_for_backward = 2;
  size_t saved_inverse = 0, fws_inverse = 0, bws_inverse = 0;
  ASSERT_EQ(cakeForwardSavedSize(&c.options, &c.fwd, &saved_inverse), cakeSuccess);
  ASSERT_EQ(cakeForwardWorkspaceSize(&c.options, &c.fwd, &fws_inverse), cakeSuccess);
  ASSERT_EQ(cakeBackwardWorkspaceSize(&c.options, &c.bwd, &bws_inverse), cakeSuccess);
  size_t const solved = up(bt * hv * 4) + up(bt * hv * 64 * 2) + up(bt * hv * 4);
  EXPECT_EQ(saved_inverse, qk_norm + up(bt * hv * 4) + up(bt * hv * 64 * 2) + bt * hv * 4);
  EXPECT_EQ(fws_inverse, 256u);
  size_t const flags = 1 * hv * 4;
  size_t const order = (1 + 2 * 4 * 1) * 4;  // the last region in saved mode, then the flags'
  EXPECT_EQ(bws_inverse, bws - order + up(order) + 4 * hv * d * d * 2 + flags);
  EXPECT_EQ(bws_recompute, bws_inverse + qk_norm + solved);

  // Without use_qk_l2norm: no q, k normalised anywhere.
  c.options.use_qk_l2norm = 0;
  size_t saved_inverse_no_l2 = 0;
  ASSERT_EQ(cakeForwardSavedSize(&c.options, &c.fwd, &saved_inverse_no_l2), cakeSuccess);
  ASSERT_EQ(cakeForwardWorkspaceSize(&c.options, &c.fwd, &fws_inverse), cakeSuccess);
  EXPECT_EQ(saved_inverse_no_l2, saved_inverse - qk_norm) << "no q, k normalised to keep";
  EXPECT_EQ(fws_inverse, 256u);
  c.options.save_for_backward = 1;
  size_t saved_no_l2 = 0;
  ASSERT_EQ(cakeForwardSavedSize(&c.options, &c.fwd, &saved_no_l2), cakeSuccess);
  EXPECT_EQ(saved_no_l2, saved - qk_norm) << "without use_qk_l2norm q, k are not saved";
}

// With use_qk_l2norm, GDN's CUDA backward of saved and inverse modes reads no element of q or k
// (include/cake/cake.h): any strides pass there (a one-element stand-in expanded to the shape), but
// not in recompute mode, nor without the norm, nor in the forward, nor in KDA's backward. The
// support checks are host code (src/ops/support.cpp), so a build without CUDA checks them too,
// then answers cakeNotImplemented where a CUDA build goes on.
TEST(Validation, CudaBackwardTakesQkStandInsWhereItReadsNone) {
  CudaShapes c;
  size_t bytes = 0;
  bool const cuda = cakeForwardSavedSize(&c.options, &c.fwd, &bytes) != cakeNotImplemented;
  cakeResult_t const accepted = cuda ? cakeSuccess : cakeNotImplemented;
  for (cakeTensor_t* t : {&c.bwd.q, &c.bwd.k, &c.fwd.q, &c.fwd.k})
    std::fill(t->strides, t->strides + t->ndim, 0);
  for (int mode : {1, 2}) {
    c.options.save_for_backward = mode;
    EXPECT_EQ(cakeBackwardWorkspaceSize(&c.options, &c.bwd, &bytes), accepted)
        << "mode " << mode << ": " << last_error();
    expect_error(cakeForwardWorkspaceSize(&c.options, &c.fwd, &bytes), cakeInvalidArgument,
                 {"q must be contiguous for the CUDA kernels"});
  }
  c.options.save_for_backward = 0;
  expect_error(cakeBackwardWorkspaceSize(&c.options, &c.bwd, &bytes), cakeInvalidArgument,
               {"q must be contiguous for the CUDA kernels"});
  c.options.save_for_backward = 2;
  c.options.use_qk_l2norm = 0;
  expect_error(cakeBackwardWorkspaceSize(&c.options, &c.bwd, &bytes), cakeInvalidArgument,
               {"q must be contiguous for the CUDA kernels"});
  // KDA's backward keeps q and k checked in every mode (cuda_backward_reads_qk).
  std::vector<float> gate(CudaShapes::T * CudaShapes::HV * CudaShapes::D);
  c.options.variant = cakeKda;
  c.options.use_qk_l2norm = 1;
  c.bwd.g = view(gate.data(), cakeFloat32, {1, CudaShapes::T, CudaShapes::HV, CudaShapes::D});
  c.bwd.g.device_type = cakeCUDA;
  for (int mode : {0, 1, 2}) {
    c.options.save_for_backward = mode;
    expect_error(cakeBackwardWorkspaceSize(&c.options, &c.bwd, &bytes), cakeInvalidArgument,
                 {"q must be contiguous for the CUDA kernels"});
  }
}

// ------------------------------------------------------------------------------------------------
// Happy paths
// ------------------------------------------------------------------------------------------------

// The GDN / KDA recurrence on the problem's documents, token by token.
void recurrence(Problem const& p, std::vector<double>& o, std::vector<double>& ht) {
  constexpr int64_t HV = Problem::HV, K = Problem::K, V = Problem::V, H = Problem::H;
  o.assign(Problem::T * HV * V, 0.0);
  ht.assign(Problem::N * HV * K * V, 0.0);
  for (int64_t n = 0; n < Problem::N; ++n) {
    for (int64_t hv = 0; hv < HV; ++hv) {
      int64_t const h = hv / (HV / H);
      std::vector<double> S(p.h0.begin() + (n * HV + hv) * K * V,
                            p.h0.begin() + (n * HV + hv + 1) * K * V);
      for (int64_t t = p.cu[n]; t < p.cu[n + 1]; ++t) {
        double const* q = &p.q[(t * H + h) * K];
        double const* k = &p.k[(t * H + h) * K];
        double const* v = &p.v[(t * HV + hv) * V];
        double const b = p.beta[t * HV + hv];
        for (int64_t i = 0; i < K; ++i) {
          double const decay = std::exp(p.kda ? p.g[(t * HV + hv) * K + i] : p.g[t * HV + hv]);
          for (int64_t j = 0; j < V; ++j) S[i * V + j] *= decay;
        }
        for (int64_t j = 0; j < V; ++j) {
          double pred = 0;
          for (int64_t i = 0; i < K; ++i) pred += S[i * V + j] * k[i];
          double const u = b * (v[j] - pred);
          for (int64_t i = 0; i < K; ++i) S[i * V + j] += k[i] * u;
        }
        for (int64_t j = 0; j < V; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < K; ++i) acc += S[i * V + j] * q[i];
          o[(t * HV + hv) * V + j] = p.options.scale * acc;
        }
      }
      std::copy(S.begin(), S.end(), ht.begin() + (n * HV + hv) * K * V);
    }
  }
}

TEST(Validation, HappyPathWritesEveryOutput) {
  for (bool kda : {false, true}) {
    Problem p(kda);
    size_t bytes = 77;
    ASSERT_EQ(p.forward_size(&bytes), cakeSuccess) << last_error();
    EXPECT_EQ(bytes, 0u);
    ASSERT_EQ(p.forward(), cakeSuccess) << last_error();
    std::vector<double> o, ht;
    recurrence(p, o, ht);
    for (size_t i = 0; i < o.size(); ++i) {
      ASSERT_TRUE(std::isfinite(p.o[i])) << "o[" << i << "] not written";
      EXPECT_NEAR(p.o[i], o[i], 1e-12 * (1 + std::fabs(o[i]))) << "o[" << i << "]";
    }
    EXPECT_TRUE(std::isnan(p.o[o.size()])) << "wrote past the end of o";
    for (size_t i = 0; i < ht.size(); ++i) {
      ASSERT_TRUE(std::isfinite(p.ht[i])) << "final_state[" << i << "] not written";
      EXPECT_NEAR(p.ht[i], ht[i], 1e-12 * (1 + std::fabs(ht[i]))) << "final_state[" << i << "]";
    }
    EXPECT_TRUE(std::isnan(p.ht[ht.size()])) << "wrote past the end of final_state";
  }
}

TEST(Validation, HappyPathFloat32Output) {
  Problem p;
  std::vector<float> o32(Problem::T * Problem::HV * Problem::V + 1,
                         std::numeric_limits<float>::quiet_NaN());
  p.fwd.o = view(o32.data(), cakeFloat32, {1, 8, 2, 4});
  ASSERT_EQ(p.forward(), cakeSuccess) << last_error();
  std::vector<double> o, ht;
  recurrence(p, o, ht);
  for (size_t i = 0; i < o.size(); ++i) {
    EXPECT_EQ(o32[i], static_cast<float>(o[i])) << "o[" << i << "] is not o rounded to float32";
  }
  EXPECT_TRUE(std::isnan(o32.back()));
}

TEST(Validation, HappyPathBackwardWritesEveryGradient) {
  for (bool kda : {false, true}) {
    Problem p(kda);
    ASSERT_EQ(p.backward(), cakeSuccess) << last_error();
    auto check = [](std::vector<double> const& x, int64_t n, char const* name) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(x[i])) << name << "[" << i << "] not written";
      }
      EXPECT_TRUE(std::isnan(x[n])) << "wrote past the end of " << name;
    };
    constexpr int64_t T = Problem::T, H = Problem::H, HV = Problem::HV, K = Problem::K,
                      V = Problem::V, N = Problem::N;
    check(p.dq, T * H * K, "dq");
    check(p.dk, T * H * K, "dk");
    check(p.dv, T * HV * V, "dv");
    check(p.dg, T * HV * (kda ? K : 1), "dg");
    check(p.dbeta, T * HV, "dbeta");
    check(p.dh0, N * HV * K * V, "dh0");
  }
}

TEST(Validation, AbsentGradientsAreNotComputed) {
  Problem p;
  p.bwd.dq = cakeTensor_t{};
  p.bwd.dh0 = cakeTensor_t{};
  ASSERT_EQ(p.backward(), cakeSuccess) << last_error();
  EXPECT_TRUE(std::isnan(p.dq[0]));
  EXPECT_TRUE(std::isnan(p.dh0[0]));
  EXPECT_TRUE(std::isfinite(p.dk[0]));
}

// ------------------------------------------------------------------------------------------------
// Known bugs. Each test pins today's wrong behaviour and says what is right; it fails once the bug
// is fixed (like pytest's xfail(strict=True)): then change it to expect the right behaviour.
// ------------------------------------------------------------------------------------------------

// KNOWN BUG (src/ops/validate.cpp check_inputs): negative sizes are not rejected. A problem whose
// q, k, v, g, beta and o all have T = -1 (or B = -1) passes validation and then fails in
// src/ops/reference.cpp allocating std::vector(numel < 0) with cakeInternalError "internal error:
// cannot create std::vector larger than max_size()". Right: cakeInvalidArgument naming q and its
// shape [1, -1, 1, 4].
TEST(Validation, NegativeSizesAreInvalid) {
  for (int dim : {0, 1}) {
    Problem p;
    for (auto* t : {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.g, &p.fwd.beta, &p.fwd.o}) {
      t->shape[dim] = -1;
    }
    p.fwd.initial_state = cakeTensor_t{};
    p.fwd.final_state = cakeTensor_t{};
    p.fwd.cu_seqlens = cakeTensor_t{};
    expect_error(p.forward(), cakeInvalidArgument, {"q must have non-negative sizes", "-1"});
  }
}

TEST(Validation, EmptyProblemSucceeds) {
  Problem p;
  for (auto* t : {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.g, &p.fwd.beta, &p.fwd.o}) {
    t->shape[1] = 0;
  }
  p.fwd.cu_seqlens = cakeTensor_t{};
  p.fwd.initial_state = view(p.h0.data(), cakeFloat64, {1, 2, 4, 4});
  p.fwd.final_state = view(p.ht.data(), cakeFloat64, {1, 2, 4, 4});
  ASSERT_EQ(p.forward(), cakeSuccess) << last_error();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(p.ht[i], p.h0[i]) << "final_state[" << i << "]";
  EXPECT_TRUE(std::isnan(p.ht[32]));
}

}  // namespace
