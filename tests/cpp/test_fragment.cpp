// Exact state passing across fragments (src/ref/fragment.hpp): documents cut into 2-5 fragments
// give, through composed summaries and the adjoint chain, the single walk's final states, outputs,
// dh0 and per-token gradients to 1e-10 relative. GDN and KDA, with GVA (HV = 2 H).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "ref/fragment.hpp"
#include "ref/recurrent.hpp"
#include "ref_testing.hpp"

namespace {

using cake::ref::AffineSummary;
using cake::ref::Gate;
using cake::testing::rel_error;

constexpr double kTolerance = 1e-10;

// Cuts [begin, end) into `pieces` non-empty fragments at random points: [pieces + 1] bounds.
std::vector<int64_t> random_cuts(int64_t begin, int64_t end, int pieces, std::mt19937_64& rng) {
  std::vector<int64_t> inner(end - begin - 1);
  for (size_t i = 0; i < inner.size(); ++i) inner[i] = begin + 1 + static_cast<int64_t>(i);
  std::shuffle(inner.begin(), inner.end(), rng);
  inner.resize(pieces - 1);
  std::sort(inner.begin(), inner.end());
  std::vector<int64_t> cuts{begin};
  cuts.insert(cuts.end(), inner.begin(), inner.end());
  cuts.push_back(end);
  return cuts;
}

// The [HV, K, V] block of document n in an [N, HV, K, V] array.
std::vector<double> doc_block(std::vector<double> const& x, int64_t n, int64_t block) {
  return {x.begin() + n * block, x.begin() + (n + 1) * block};
}

struct Grads {
  std::vector<double> dq, dk, dv, dg, dbeta, dh0;
  explicit Grads(cake::testing::RefProblem const& p)
      : dq(p.q.size()),
        dk(p.k.size()),
        dv(p.v.size()),
        dg(p.g.size()),
        dbeta(p.beta.size()),
        dh0(p.state_size()) {}
  cake::ref::InputGrads view(double* dh0_block) {
    return {dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), dh0_block};
  }
};

void check_fragments(Gate gate, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int64_t const H = 2, HV = 4, K = 6, V = 5;
  auto const p = cake::testing::random_problem(gate, {37, 90, 5, 64}, H, HV, K, V, true, seed);
  auto const& shape = p.shape;
  auto const in = p.inputs();
  int64_t const N = shape.num_seqs(), block = HV * K * V;

  // The single walk.
  std::vector<double> o(p.o_size()), ht(p.state_size());
  cake::ref::recurrent_forward(shape, in, {o.data(), ht.data()});
  std::vector<double> const d_o = cake::testing::random_vector(p.o_size(), seed + 1);
  std::vector<double> const dht = cake::testing::random_vector(p.state_size(), seed + 2);
  Grads reference(p);
  cake::ref::recurrent_backward(shape, in, {d_o.data(), dht.data()},
                                reference.view(reference.dh0.data()));

  // The fragments: every document in 2-5 pieces (at most its length), walked piece by piece.
  std::vector<double> o_pieces(p.o_size()), ht_pieces(p.state_size());
  Grads pieces(p);
  for (int64_t n = 0; n < N; ++n) {
    SCOPED_TRACE("document " + std::to_string(n));
    int64_t const begin = shape.cu_seqlens[n], end = shape.cu_seqlens[n + 1];
    int const num_pieces = std::uniform_int_distribution<int>(
        2, static_cast<int>(std::min<int64_t>(5, end - begin)))(rng);
    std::vector<int64_t> const cuts = random_cuts(begin, end, num_pieces, rng);
    std::vector<double> const h0 = doc_block(p.h0, n, block);

    // Forward: S_in of piece j = (summary j-1 o ... o summary 0)(h0); walk each piece from it.
    std::vector<AffineSummary> total(HV, cake::ref::identity_summary(K, V));
    std::vector<std::vector<double>> s_in(num_pieces);
    std::vector<double> s_out(block);
    for (int j = 0; j < num_pieces; ++j) {
      s_in[j] = cake::ref::apply(total, h0.data());
      total =
          cake::ref::compose(cake::ref::fragment_summary(shape, in, cuts[j], cuts[j + 1]), total);
      cake::ref::fragment_forward(shape, in, cuts[j], cuts[j + 1], s_in[j].data(), o_pieces.data(),
                                  s_out.data());
    }
    std::copy(s_out.begin(), s_out.end(), ht_pieces.begin() + n * block);
    // The composed summary alone gives the final state.
    EXPECT_LT(rel_error(cake::ref::apply(total, h0.data()), doc_block(ht, n, block)), kTolerance);

    // Backward: dS_out of piece j = (adjoint j+1 o ... o adjoint last)(dht). The adjoint
    // summaries compose from the last piece to the first and end at dh0.
    std::vector<AffineSummary> adjoint_total(HV, cake::ref::identity_summary(K, V));
    std::vector<double> ds = doc_block(dht, n, block);
    for (int j = num_pieces - 1; j >= 0; --j) {
      std::vector<double> ds_in(block);
      cake::ref::fragment_backward(shape, in, cuts[j], cuts[j + 1], s_in[j].data(), d_o.data(),
                                   ds.data(), pieces.view(ds_in.data()));
      auto const adjoint =
          cake::ref::fragment_adjoint_summary(shape, in, d_o.data(), cuts[j], cuts[j + 1]);
      adjoint_total = cake::ref::compose(adjoint, adjoint_total);
      ds = cake::ref::apply(adjoint, ds.data());
      // The piece's own backward and its adjoint summary agree on dS_in.
      EXPECT_LT(rel_error(ds, ds_in), kTolerance) << "piece " << j;
    }
    std::copy(ds.begin(), ds.end(), pieces.dh0.begin() + n * block);
    std::vector<double> const dht_n = doc_block(dht, n, block);
    EXPECT_LT(rel_error(cake::ref::apply(adjoint_total, dht_n.data()),
                        doc_block(reference.dh0, n, block)),
              kTolerance);
  }

  EXPECT_LT(rel_error(o_pieces, o), kTolerance);
  EXPECT_LT(rel_error(ht_pieces, ht), kTolerance);
  EXPECT_LT(rel_error(pieces.dh0, reference.dh0), kTolerance);
  EXPECT_LT(rel_error(pieces.dq, reference.dq), kTolerance);
  EXPECT_LT(rel_error(pieces.dk, reference.dk), kTolerance);
  EXPECT_LT(rel_error(pieces.dv, reference.dv), kTolerance);
  EXPECT_LT(rel_error(pieces.dg, reference.dg), kTolerance);
  EXPECT_LT(rel_error(pieces.dbeta, reference.dbeta), kTolerance);
}

TEST(Fragment, GdnPiecesEqualSingleWalk) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    check_fragments(Gate::kScalar, seed);
  }
}

TEST(Fragment, KdaPiecesEqualSingleWalk) {
  for (uint64_t seed : {4u, 5u, 6u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    check_fragments(Gate::kChannel, seed);
  }
}

// Composition is associative and (I, 0) is its unit; apply(second o first) = second(first(S)).
TEST(Fragment, CompositionAlgebra) {
  int64_t const K = 4, V = 3;
  auto random_summary = [&](uint64_t seed) {
    return AffineSummary{K, V, cake::testing::random_vector(K * K, seed),
                         cake::testing::random_vector(K * V, seed + 100)};
  };
  AffineSummary const a = random_summary(1), b = random_summary(2), c = random_summary(3);
  AffineSummary const left = cake::ref::compose(c, cake::ref::compose(b, a));
  AffineSummary const right = cake::ref::compose(cake::ref::compose(c, b), a);
  EXPECT_LT(rel_error(left.m, right.m), 1e-14);
  EXPECT_LT(rel_error(left.b, right.b), 1e-14);
  AffineSummary const unit = cake::ref::compose(cake::ref::identity_summary(K, V), a);
  EXPECT_EQ(unit.m, a.m);
  EXPECT_EQ(unit.b, a.b);
  std::vector<double> const s = cake::testing::random_vector(K * V, 9);
  std::vector<double> const once = cake::ref::apply(cake::ref::compose(b, a), s.data());
  std::vector<double> const twice = cake::ref::apply(b, cake::ref::apply(a, s.data()).data());
  EXPECT_LT(rel_error(once, twice), 1e-14);
  EXPECT_THROW(cake::ref::compose(cake::ref::identity_summary(K, V + 1), a), cake::Error);
}

// One fragment walked from a random S_in ends where its summary says: M S_in + B.
TEST(Fragment, SummaryIsTheWalk) {
  auto p = cake::testing::random_problem(Gate::kChannel, {30}, 1, 2, 4, 3, true, 11);
  auto const in = p.inputs();
  auto const summary = cake::ref::fragment_summary(p.shape, in, 7, 30);
  std::vector<double> o(p.o_size()), s_out(p.state_size());
  cake::ref::fragment_forward(p.shape, in, 7, 30, p.h0.data(), o.data(), s_out.data());
  for (int64_t hv = 0; hv < 2; ++hv) {
    std::vector<double> const expected(s_out.begin() + hv * 12, s_out.begin() + (hv + 1) * 12);
    EXPECT_LT(rel_error(cake::ref::apply(summary[hv], p.h0.data() + hv * 12), expected), 1e-12);
  }
}

TEST(Fragment, RejectsRangesAcrossDocuments) {
  auto const p = cake::testing::random_problem(Gate::kScalar, {10, 10}, 1, 1, 4, 4, false, 1);
  auto const in = p.inputs();
  try {
    cake::ref::fragment_summary(p.shape, in, 5, 15);
    ADD_FAILURE() << "no error";
  } catch (cake::Error const& e) {
    EXPECT_EQ(e.code(), cakeInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("inside one document"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cake::ref::fragment_summary(p.shape, in, 5, 5), cake::Error);
  EXPECT_THROW(cake::ref::fragment_summary(p.shape, in, 15, 21), cake::Error);
}

}  // namespace
