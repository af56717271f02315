// The FP64 model of the planned fused GDN backward (ref/gdn_walk_model.hpp: an h-walk, then one
// reverse walk per document and value head from A, G and h only) against the stage-by-stage
// chunked reference (ref/chunked.hpp), on varlen packs with grouped value heads, initial and final
// state gradients, edge document lengths and adversarial gates and betas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ref/chunked.hpp"
#include "ref/gdn_walk_model.hpp"
#include "ref_testing.hpp"

namespace {

using cake::ref::Gate;
using cake::testing::random_problem;
using cake::testing::random_vector;
using cake::testing::RefProblem;
using cake::testing::rel_error;
using Vec = std::vector<double>;

struct Grads {
  Vec dq, dk, dv, dg, dbeta, dh0;
};

// Both backwards for the same d_o and dht; outputs start as NaN, so unwritten elements show.
void expect_model_matches_chunked(RefProblem const& p, int chunk_size, uint64_t seed,
                                  double tol = 1e-10) {
  Vec const d_o = random_vector(p.o_size(), seed);
  Vec const dht = random_vector(p.state_size(), seed + 1);
  double const nan = std::nan("");
  auto run = [&](bool model) {
    Grads b{Vec(p.q.size(), nan), Vec(p.k.size(), nan),    Vec(p.v.size(), nan),
            Vec(p.g.size(), nan), Vec(p.beta.size(), nan), Vec(p.h0.size(), nan)};
    cake::ref::OutputGrads const out{d_o.data(), dht.data()};
    cake::ref::InputGrads const in{b.dq.data(),    b.dk.data(),
                                   b.dv.data(),    b.dg.data(),
                                   b.dbeta.data(), b.dh0.empty() ? nullptr : b.dh0.data()};
    if (model)
      cake::ref::gdn_model::walk_backward(p.shape, p.inputs(), out, in, chunk_size);
    else
      cake::ref::chunked_backward(p.shape, p.inputs(), out, in, chunk_size);
    return b;
  };
  Grads const m = run(true);
  Grads const r = run(false);
  std::vector<std::pair<std::string, std::pair<Vec const*, Vec const*>>> const named = {
      {"dq", {&m.dq, &r.dq}}, {"dk", {&m.dk, &r.dk}},          {"dv", {&m.dv, &r.dv}},
      {"dg", {&m.dg, &r.dg}}, {"dbeta", {&m.dbeta, &r.dbeta}}, {"dh0", {&m.dh0, &r.dh0}}};
  for (auto const& [name, pair] : named) {
    for (double x : *pair.first) ASSERT_TRUE(std::isfinite(x)) << name;
    EXPECT_LT(rel_error(*pair.first, *pair.second), tol) << name;
  }
}

TEST(GdnWalkModel, SmallChunksVarlenGva) {
  RefProblem const p = random_problem(Gate::kScalar, {1, 3, 4, 5, 9, 17}, 2, 6, 8, 4, true, 11);
  expect_model_matches_chunked(p, 4, 12);
  expect_model_matches_chunked(p, 8, 13);
}

TEST(GdnWalkModel, EdgeLengthsChunk64) {
  RefProblem const p = random_problem(Gate::kScalar, {1, 63, 64, 65, 130}, 1, 2, 16, 8, true, 21);
  expect_model_matches_chunked(p, 64, 22);
}

TEST(GdnWalkModel, StrongAndZeroDecay) {
  // g = -20 per token: e^G underflows within a chunk; every factor the model forms is <= 1.
  expect_model_matches_chunked(
      random_problem(Gate::kScalar, {5, 17, 9}, 2, 4, 8, 4, true, 31, -20.0, -20.0), 8, 32);
  expect_model_matches_chunked(
      random_problem(Gate::kScalar, {5, 17, 9}, 2, 4, 8, 4, true, 33, 0.0, 0.0), 8, 34);
}

TEST(GdnWalkModel, BetaNearZeroAndOne) {
  for (double b : {1e-4, 1.0 - 1e-4}) {
    RefProblem p = random_problem(Gate::kScalar, {7, 20}, 1, 3, 8, 4, true, 41);
    for (auto& x : p.beta) x = b;
    expect_model_matches_chunked(p, 8, 42);
  }
}

TEST(GdnWalkModel, NoInitialState) {
  RefProblem const p = random_problem(Gate::kScalar, {12, 3}, 2, 2, 8, 4, false, 51);
  expect_model_matches_chunked(p, 4, 52);
}

}  // namespace
