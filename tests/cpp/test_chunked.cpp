// The chunked FP64 algorithm (ref/chunked.hpp): its analytic backward against central finite
// differences of its own forward, forward and backward against the token-by-token recurrence
// (ref/recurrent.hpp), adversarial gates and betas, determinism, and checks of single stages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "ref/chunk_cumsum.hpp"
#include "ref/chunk_solve.hpp"
#include "ref/chunked.hpp"
#include "ref/recurrent.hpp"
#include "ref_testing.hpp"

namespace {

using cake::ref::Gate;
using cake::testing::dot;
using cake::testing::random_problem;
using cake::testing::random_vector;
using cake::testing::RefProblem;
using cake::testing::rel_error;
using Vec = std::vector<double>;

std::string gate_name(Gate gate) { return gate == Gate::kScalar ? "GDN" : "KDA"; }

struct Forward {
  Vec o, ht;  // [T, HV, V], [N, HV, K, V]
};

struct Backward {
  Vec dq, dk, dv, dg, dbeta, dh0;  // dh0 empty when the problem has no h0
};

enum class Algorithm { kChunked, kRecurrent };

Forward run_forward(RefProblem const& p, Algorithm algorithm, int chunk_size) {
  Forward f{Vec(p.o_size()), Vec(p.state_size())};
  cake::ref::Outputs const out{f.o.data(), f.ht.data()};
  if (algorithm == Algorithm::kChunked)
    cake::ref::chunked_forward(p.shape, p.inputs(), out, chunk_size);
  else
    cake::ref::recurrent_forward(p.shape, p.inputs(), out);
  return f;
}

// Gradients for d_o and dht (dht empty: none). Outputs start as NaN, to show they are overwritten.
Backward run_backward(RefProblem const& p, Vec const& d_o, Vec const& dht, Algorithm algorithm,
                      int chunk_size) {
  double const nan = std::nan("");
  Backward b{Vec(p.q.size(), nan), Vec(p.k.size(), nan),    Vec(p.v.size(), nan),
             Vec(p.g.size(), nan), Vec(p.beta.size(), nan), Vec(p.h0.size(), nan)};
  cake::ref::OutputGrads const grad_out{d_o.data(), dht.empty() ? nullptr : dht.data()};
  cake::ref::InputGrads const grad_in{b.dq.data(),    b.dk.data(),
                                      b.dv.data(),    b.dg.data(),
                                      b.dbeta.data(), b.dh0.empty() ? nullptr : b.dh0.data()};
  if (algorithm == Algorithm::kChunked)
    cake::ref::chunked_backward(p.shape, p.inputs(), grad_out, grad_in, chunk_size);
  else
    cake::ref::recurrent_backward(p.shape, p.inputs(), grad_out, grad_in);
  return b;
}

bool all_finite(Vec const& x) {
  for (double e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

std::vector<std::pair<std::string, Vec const*>> named(Backward const& b) {
  return {{"dq", &b.dq}, {"dk", &b.dk},       {"dv", &b.dv},
          {"dg", &b.dg}, {"dbeta", &b.dbeta}, {"dh0", &b.dh0}};
}

// Chunked and recurrent agree on o, ht and every gradient to `tol` relative, all finite.
void expect_matches_recurrent(RefProblem const& p, int chunk_size, double tol, uint64_t seed) {
  Vec const d_o = random_vector(p.o_size(), seed);
  Vec const dht = random_vector(p.state_size(), seed + 1);
  Forward const fc = run_forward(p, Algorithm::kChunked, chunk_size);
  Forward const fr = run_forward(p, Algorithm::kRecurrent, chunk_size);
  EXPECT_TRUE(all_finite(fc.o) && all_finite(fc.ht));
  EXPECT_LT(rel_error(fc.o, fr.o), tol) << "o";
  EXPECT_LT(rel_error(fc.ht, fr.ht), tol) << "ht";
  Backward const bc = run_backward(p, d_o, dht, Algorithm::kChunked, chunk_size);
  Backward const br = run_backward(p, d_o, dht, Algorithm::kRecurrent, chunk_size);
  auto const nc = named(bc), nr = named(br);
  for (size_t i = 0; i < nc.size(); ++i) {
    EXPECT_TRUE(all_finite(*nc[i].second)) << nc[i].first;
    EXPECT_LT(rel_error(*nc[i].second, *nr[i].second), tol) << nc[i].first;
  }
}

// ----- 1. Backward against central finite differences of the chunked forward

struct GradCase {
  Gate gate;
  int chunk_size;
};

void PrintTo(GradCase const& c, std::ostream* os) {
  *os << gate_name(c.gate) << " C=" << c.chunk_size;
}

class ChunkedFiniteDifferences : public ::testing::TestWithParam<GradCase> {};

// L = <o, W_o> + <ht, W_h>, so the backward with d_o = W_o, dht = W_h gives dL/d(input); each
// gradient is checked along a random direction of its input.
TEST_P(ChunkedFiniteDifferences, EveryGradient) {
  GradCase const c = GetParam();
  RefProblem p = random_problem(c.gate, {1, 3, 4, 5, 9, 17}, 2, 4, 8, 4, true, 101);
  Vec const W_o = random_vector(p.o_size(), 102);
  Vec const W_h = random_vector(p.state_size(), 103);
  auto loss = [&] {
    Forward const f = run_forward(p, Algorithm::kChunked, c.chunk_size);
    return dot(f.o, W_o) + dot(f.ht, W_h);
  };
  Backward const b = run_backward(p, W_o, W_h, Algorithm::kChunked, c.chunk_size);
  std::vector<std::pair<std::string, std::pair<Vec*, Vec const*>>> const inputs = {
      {"q", {&p.q, &b.dq}}, {"k", {&p.k, &b.dk}},          {"v", {&p.v, &b.dv}},
      {"g", {&p.g, &b.dg}}, {"beta", {&p.beta, &b.dbeta}}, {"h0", {&p.h0, &b.dh0}}};
  uint64_t seed = 200;
  for (auto const& [name, pair] : inputs) {
    auto const& [x, dx] = pair;
    Vec const direction = random_vector(x->size(), seed++);
    double const analytic = dot(*dx, direction);
    double const numeric = cake::testing::directional_derivative(*x, direction, loss);
    EXPECT_LT(std::abs(numeric - analytic), 1e-6 * std::abs(analytic))
        << name << ": finite difference " << numeric << ", backward " << analytic;
  }
}

INSTANTIATE_TEST_SUITE_P(GateAndChunk, ChunkedFiniteDifferences,
                         ::testing::Values(GradCase{Gate::kScalar, 4}, GradCase{Gate::kScalar, 8},
                                           GradCase{Gate::kChannel, 4},
                                           GradCase{Gate::kChannel, 8}),
                         [](auto const& info) {
                           return gate_name(info.param.gate) + "_C" +
                                  std::to_string(info.param.chunk_size);
                         });

// ----- 2. Chunked == recurrent

struct MatchCase {
  Gate gate;
  int chunk_size;
  int group_size;  // HV / H
};

void PrintTo(MatchCase const& c, std::ostream* os) {
  *os << gate_name(c.gate) << " C=" << c.chunk_size << " HV/H=" << c.group_size;
}

class ChunkedVsRecurrent : public ::testing::TestWithParam<MatchCase> {};

// Documents on both sides of the chunk boundaries: 1, C-1, C, C+1 and 2C+2 tokens at C = 64.
TEST_P(ChunkedVsRecurrent, BoundaryLengths) {
  MatchCase const c = GetParam();
  RefProblem const p =
      random_problem(c.gate, {1, 63, 64, 65, 130}, 2, 2 * c.group_size, 16, 16, true, 300);
  expect_matches_recurrent(p, c.chunk_size, 1e-10, 301);
}

// Many short documents, some of them empty (ht = h0, dh0 = dht there).
TEST_P(ChunkedVsRecurrent, ManyShortDocuments) {
  MatchCase const c = GetParam();
  std::vector<int64_t> lengths = {0, 2, 7, 0, 0, 1, 5, 16, 3, 0, 17, 4, 9, 0, 1, 11, 6, 0};
  RefProblem const p = random_problem(c.gate, lengths, 1, c.group_size, 8, 8, true, 400);
  expect_matches_recurrent(p, c.chunk_size, 1e-10, 401);
}

std::vector<MatchCase> all_match_cases() {
  std::vector<MatchCase> cases;
  for (Gate gate : {Gate::kScalar, Gate::kChannel})
    for (int chunk_size : {4, 16, 64})
      for (int group_size : {1, 2, 3}) cases.push_back({gate, chunk_size, group_size});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(GateChunkGroup, ChunkedVsRecurrent, ::testing::ValuesIn(all_match_cases()),
                         [](auto const& info) {
                           return gate_name(info.param.gate) + "_C" +
                                  std::to_string(info.param.chunk_size) + "_G" +
                                  std::to_string(info.param.group_size);
                         });

// Empty documents: the state passes through untouched, forward and backward.
TEST(ChunkedEmptyDocuments, StatePassesThrough) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    SCOPED_TRACE(gate_name(gate));
    RefProblem const p = random_problem(gate, {0, 5, 0}, 1, 2, 4, 3, true, 500);
    int64_t const state = 2 * 4 * 3;  // HV K V per document
    Vec const d_o = random_vector(p.o_size(), 501);
    Vec const dht = random_vector(p.state_size(), 502);
    Forward const f = run_forward(p, Algorithm::kChunked, 4);
    Backward const b = run_backward(p, d_o, dht, Algorithm::kChunked, 4);
    for (int64_t n : {0, 2}) {
      for (int64_t i = n * state; i < (n + 1) * state; ++i) {
        EXPECT_EQ(f.ht[i], p.h0[i]);
        EXPECT_EQ(b.dh0[i], dht[i]);
      }
    }
  }
}

// ----- 3. Adversarial gates and betas at C = 64 with a 130-token document

struct AdversarialCase {
  Gate gate;
  std::string name;
  double g;     // every token's gate, every channel
  double beta;  // every token's beta, or < 0: keep the random betas
};

void PrintTo(AdversarialCase const& c, std::ostream* os) {
  *os << gate_name(c.gate) << " " << c.name;
}

std::vector<AdversarialCase> all_adversarial_cases() {
  std::vector<AdversarialCase> cases;
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    cases.push_back({gate, "StrongDecay", -20.0, -1.0});  // e^{-G} would reach e^{1280}
    cases.push_back({gate, "NoDecay", 0.0, -1.0});
    cases.push_back({gate, "BetaNearZero", -0.5, 1e-9});
    cases.push_back({gate, "BetaNearOne", -0.5, 1.0 - 1e-9});
    cases.push_back({gate, "BetaOneNoDecay", 0.0, 1.0});
  }
  return cases;
}

class ChunkedAdversarial : public ::testing::TestWithParam<AdversarialCase> {};

TEST_P(ChunkedAdversarial, FiniteAndEqualToRecurrence) {
  AdversarialCase const& c = GetParam();
  RefProblem p = random_problem(c.gate, {130}, 2, 4, 16, 16, true, 600);
  for (double& e : p.g) e = c.g;
  if (c.beta >= 0)
    for (double& e : p.beta) e = c.beta;
  expect_matches_recurrent(p, 64, 1e-10, 601);
}

INSTANTIATE_TEST_SUITE_P(GateAndCase, ChunkedAdversarial,
                         ::testing::ValuesIn(all_adversarial_cases()), [](auto const& info) {
                           return gate_name(info.param.gate) + "_" + info.param.name;
                         });

// ----- 4. Determinism

TEST(ChunkedDeterminism, BackwardIsBitwiseReproducible) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    SCOPED_TRACE(gate_name(gate));
    RefProblem const p = random_problem(gate, {70, 3, 130, 0, 41}, 2, 6, 16, 8, true, 700);
    Vec const d_o = random_vector(p.o_size(), 701);
    Vec const dht = random_vector(p.state_size(), 702);
    Backward const first = run_backward(p, d_o, dht, Algorithm::kChunked, 16);
    Backward const second = run_backward(p, d_o, dht, Algorithm::kChunked, 16);
    auto const a = named(first), b = named(second);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(0, std::memcmp(a[i].second->data(), b[i].second->data(),
                               a[i].second->size() * sizeof(double)))
          << a[i].first;
  }
}

// ----- Single stages

// The cumsum restarts at every chunk and every document: C = 4, documents of 6 and 3 tokens.
TEST(ChunkedStages, CumsumRestartsAtChunksAndDocuments) {
  RefProblem const p = random_problem(Gate::kScalar, {6, 3}, 1, 1, 2, 2, false, 800);
  cake::ref::ChunkTiling const tiling(p.shape, 4);
  EXPECT_EQ(tiling.chunk_offsets, (std::vector<int64_t>{0, 2, 3}));
  Vec G(p.g.size()), dg(p.g.size());
  cake::ref::chunk_local_cumsum(p.shape, tiling, p.g.data(), G.data());
  for (int64_t begin : {0, 4, 6}) {
    int64_t const end = begin == 0 ? 4 : (begin == 4 ? 6 : 9);
    double sum = 0;
    for (int64_t t = begin; t < end; ++t) EXPECT_DOUBLE_EQ(G[t], sum += p.g[t]);
  }
  // The adjoint: <G(g), x> = <g, reverse_cumsum(x)> for any x.
  Vec const x = random_vector(p.g.size(), 801);
  cake::ref::chunk_local_reverse_cumsum(p.shape, tiling, x.data(), dg.data());
  EXPECT_NEAR(dot(G, x), dot(p.g, dg), 1e-14);
}

// A holds T = (I + L)^-1 with L from its definition: check (I + L) T = I row by row, and zeros
// above the diagonal and past a partial chunk.
TEST(ChunkedStages, SolveInvertsIPlusL) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    SCOPED_TRACE(gate_name(gate));
    int64_t const C = 8, K = 4, HV = 2, H = 1;
    RefProblem const p = random_problem(gate, {13}, H, HV, K, 2, false, 900);
    cake::ref::ChunkTiling const tiling(p.shape, C);
    cake::ref::Layout const ix(p.shape, C);
    Vec G(p.g.size()), A(13 * HV * C, std::nan(""));
    cake::ref::chunk_local_cumsum(p.shape, tiling, p.g.data(), G.data());
    cake::ref::chunk_solve_forward(p.shape, tiling, p.k.data(), p.beta.data(), G.data(), A.data());
    for (int64_t hv = 0; hv < HV; ++hv)
      for (int64_t begin : {0, 8}) {
        int64_t const n = begin == 0 ? 8 : 5;
        auto L = [&](int64_t i, int64_t j) {
          if (i <= j) return 0.0;
          double dot_ij = 0;
          for (int64_t d = 0; d < K; ++d) {
            int64_t const gd = gate == Gate::kScalar ? 0 : d;
            dot_ij += p.k[ix.qk(begin + i, 0) + d] * p.k[ix.qk(begin + j, 0) + d] *
                      std::exp(G[ix.gate(begin + i, hv) + gd] - G[ix.gate(begin + j, hv) + gd]);
          }
          return p.beta[ix.head(begin + i, hv)] * dot_ij;
        };
        auto T = [&](int64_t i, int64_t j) { return A[ix.row(begin + i, hv) + j]; };
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double prod = T(i, j);
            for (int64_t m = 0; m < n; ++m) prod += L(i, m) * T(m, j);
            EXPECT_NEAR(prod, i == j ? 1.0 : 0.0, 1e-13) << i << "," << j;
          }
          for (int64_t j = i + 1; j < C; ++j) EXPECT_EQ(T(i, j), 0.0);
        }
      }
  }
}

}  // namespace
