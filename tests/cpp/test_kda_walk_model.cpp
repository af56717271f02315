// The FP64 model of the KDA kernels (ref/kda_walk_model.hpp: the chunk pass, the forward walk,
// and the backward as an h-walk, a reverse walk and an intra pass) against the stage-by-stage
// chunked reference (ref/chunked.hpp, Gate::kChannel), on varlen packs with grouped value heads,
// states, edge document lengths, gates down to -20, g = 0 and -20 on alternate channels, and betas
// near 0 and 1. Outputs start as NaN, so unwritten elements show.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ref/chunked.hpp"
#include "ref/kda_walk_model.hpp"
#include "ref_testing.hpp"

namespace {

using cake::ref::Gate;
using cake::testing::random_problem;
using cake::testing::random_vector;
using cake::testing::RefProblem;
using cake::testing::rel_error;
using Vec = std::vector<double>;
namespace model = cake::ref::kda_model;

void expect_close(char const* name, Vec const& got, Vec const& want, double tol) {
  for (double x : got) ASSERT_TRUE(std::isfinite(x)) << name;
  EXPECT_LT(rel_error(got, want), tol) << name;
}

void expect_model_matches_chunked(RefProblem const& p, int chunk_size, uint64_t seed,
                                  double tol = 1e-10) {
  double const nan = std::nan("");
  {
    Vec o(p.o_size(), nan), ht(p.state_size(), nan), ro(o.size()), rht(ht.size());
    model::walk_forward(p.shape, p.inputs(), {o.data(), ht.data()}, chunk_size);
    cake::ref::chunked_forward(p.shape, p.inputs(), {ro.data(), rht.data()}, chunk_size);
    expect_close("o", o, ro, tol);
    expect_close("ht", ht, rht, tol);
  }
  Vec const d_o = random_vector(p.o_size(), seed);
  Vec const dht = random_vector(p.state_size(), seed + 1);
  struct Grads {
    Vec dq, dk, dv, dg, dbeta, dh0;
  };
  auto run = [&](bool use_model) {
    Grads b{Vec(p.q.size(), nan), Vec(p.k.size(), nan),    Vec(p.v.size(), nan),
            Vec(p.g.size(), nan), Vec(p.beta.size(), nan), Vec(p.h0.size(), nan)};
    cake::ref::OutputGrads const out{d_o.data(), dht.data()};
    cake::ref::InputGrads const in{b.dq.data(),    b.dk.data(),
                                   b.dv.data(),    b.dg.data(),
                                   b.dbeta.data(), b.dh0.empty() ? nullptr : b.dh0.data()};
    if (use_model)
      model::walk_backward(p.shape, p.inputs(), out, in, chunk_size);
    else
      cake::ref::chunked_backward(p.shape, p.inputs(), out, in, chunk_size);
    return b;
  };
  Grads const m = run(true);
  Grads const r = run(false);
  expect_close("dq", m.dq, r.dq, tol);
  expect_close("dk", m.dk, r.dk, tol);
  expect_close("dv", m.dv, r.dv, tol);
  expect_close("dg", m.dg, r.dg, tol);
  expect_close("dbeta", m.dbeta, r.dbeta, tol);
  expect_close("dh0", m.dh0, r.dh0, tol);
}

TEST(KdaWalkModel, SmallChunksVarlenGva) {
  RefProblem const p = random_problem(Gate::kChannel, {1, 3, 4, 5, 9, 17}, 2, 6, 8, 4, true, 11);
  expect_model_matches_chunked(p, 4, 12);
  expect_model_matches_chunked(p, 8, 13);
}

TEST(KdaWalkModel, EdgeLengthsChunk64) {
  RefProblem const p =
      random_problem(Gate::kChannel, {1, 15, 16, 17, 63, 64, 65, 130}, 1, 3, 8, 4, true, 21);
  expect_model_matches_chunked(p, 64, 22);
}

TEST(KdaWalkModel, StrongZeroAndMixedDecay) {
  expect_model_matches_chunked(
      random_problem(Gate::kChannel, {5, 17, 9}, 2, 4, 8, 4, true, 31, -20.0, -20.0), 8, 32);
  expect_model_matches_chunked(
      random_problem(Gate::kChannel, {5, 17, 9}, 2, 4, 8, 4, true, 33, 0.0, 0.0), 8, 34);
  RefProblem mixed = random_problem(Gate::kChannel, {5, 17, 9}, 1, 2, 8, 4, true, 35);
  for (size_t i = 0; i < mixed.g.size(); ++i) mixed.g[i] = i % 2 == 0 ? 0.0 : -20.0;
  expect_model_matches_chunked(mixed, 8, 36);
}

TEST(KdaWalkModel, BetaNearZeroAndOne) {
  for (double b : {1e-4, 1.0 - 1e-4}) {
    RefProblem p = random_problem(Gate::kChannel, {7, 20}, 1, 3, 8, 4, true, 41);
    for (auto& x : p.beta) x = b;
    expect_model_matches_chunked(p, 8, 42);
  }
}

TEST(KdaWalkModel, NoInitialState) {
  RefProblem const p = random_problem(Gate::kChannel, {12, 3}, 2, 2, 8, 4, false, 51);
  expect_model_matches_chunked(p, 4, 52);
}

}  // namespace
