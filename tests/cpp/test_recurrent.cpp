// The token-by-token FP64 recurrence (ref/recurrent.hpp): forward against hand formulas and
// structural identities, backward against central finite differences of a scalar loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

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

struct Forward {
  Vec o, ht;  // [T, HV, V], [N, HV, K, V]
};

Forward run_forward(RefProblem const& p) {
  Forward f{Vec(p.o_size()), Vec(p.state_size())};
  cake::ref::recurrent_forward(p.shape, p.inputs(), {f.o.data(), f.ht.data()});
  return f;
}

struct Backward {
  Vec dq, dk, dv, dg, dbeta, dh0;  // dh0 empty when the problem has no h0
};

// Gradients for output gradients d_o and dht (dht empty: none). dh0 is asked for only when the
// problem has h0. Output arrays start filled with `fill`, to show that they are overwritten.
Backward run_backward(RefProblem const& p, Vec const& d_o, Vec const& dht, double fill = 0.0) {
  Backward b{Vec(p.q.size(), fill),    Vec(p.k.size(), fill),    Vec(p.v.size(), fill),
             Vec(p.g.size(), fill),    Vec(p.beta.size(), fill), Vec(p.h0.size(), fill)};
  cake::ref::recurrent_backward(
      p.shape, p.inputs(), {d_o.data(), dht.empty() ? nullptr : dht.data()},
      {b.dq.data(), b.dk.data(), b.dv.data(), b.dg.data(), b.dbeta.data(),
       b.dh0.empty() ? nullptr : b.dh0.data()});
  return b;
}

bool all_finite(Vec const& x) {
  for (double e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

// Elements [begin, end) of x, as a vector.
Vec slice(Vec const& x, int64_t begin, int64_t end) {
  return Vec(x.begin() + begin, x.begin() + end);
}

// ----- Forward

// One token, by hand: Sbar = a h0 (a_i = exp(g_i), one value for GDN), p = Sbar^T k,
// ht = Sbar + beta k (v - p)^T, o = scale ht^T q.
void check_one_token(Gate gate, bool with_h0) {
  SCOPED_TRACE(std::string(gate == Gate::kScalar ? "GDN" : "KDA") + (with_h0 ? " h0" : ""));
  int64_t const K = 3, V = 2;
  RefProblem const p = random_problem(gate, {1}, 1, 1, K, V, with_h0, 11);
  Forward const f = run_forward(p);
  auto a = [&](int64_t i) { return std::exp(p.g[gate == Gate::kScalar ? 0 : i]); };
  auto h0 = [&](int64_t i, int64_t j) { return with_h0 ? p.h0[i * V + j] : 0.0; };
  double const beta = p.beta[0];
  for (int64_t j = 0; j < V; ++j) {
    double pj = 0;
    for (int64_t i = 0; i < K; ++i) pj += a(i) * h0(i, j) * p.k[i];
    double oj = 0;
    for (int64_t i = 0; i < K; ++i) {
      double const ht = a(i) * h0(i, j) + beta * p.k[i] * (p.v[j] - pj);
      EXPECT_NEAR(f.ht[i * V + j], ht, 1e-14);
      oj += p.scale * ht * p.q[i];
    }
    EXPECT_NEAR(f.o[j], oj, 1e-14);
  }
  if (!with_h0) {  // o = scale (k . q) beta v
    double const kq = p.k[0] * p.q[0] + p.k[1] * p.q[1] + p.k[2] * p.q[2];
    for (int64_t j = 0; j < V; ++j) EXPECT_NEAR(f.o[j], p.scale * kq * beta * p.v[j], 1e-14);
  }
}

TEST(RecurrentForward, OneTokenMatchesHandFormula) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel})
    for (bool with_h0 : {false, true}) check_one_token(gate, with_h0);
}

// Changing document 0's tokens and h0 changes its outputs, and nothing of the documents after it;
// a zero-length document passes h0 through as ht.
TEST(RecurrentForward, DocumentsAreIndependent) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    int64_t const H = 1, HV = 2, K = 4, V = 3, len0 = 6;
    RefProblem p = random_problem(gate, {len0, 0, 9}, H, HV, K, V, true, 21);
    Forward const before = run_forward(p);
    int64_t const state = HV * K * V;  // one document's slice of h0/ht
    EXPECT_EQ(slice(before.ht, state, 2 * state), slice(p.h0, state, 2 * state));

    for (Vec* x : {&p.q, &p.k, &p.v, &p.g, &p.beta}) {
      int64_t const per_token = static_cast<int64_t>(x->size()) / p.shape.num_tokens;
      for (int64_t e = 0; e < len0 * per_token; ++e) (*x)[e] = 0.5 * (*x)[e] - 0.1;
    }
    for (int64_t e = 0; e < state; ++e) p.h0[e] += 1.0;
    Forward const after = run_forward(p);

    int64_t const o_doc0 = len0 * HV * V;
    EXPECT_GT(rel_error(slice(after.o, 0, o_doc0), slice(before.o, 0, o_doc0)), 1e-3);
    EXPECT_EQ(slice(after.o, o_doc0, p.o_size()), slice(before.o, o_doc0, p.o_size()));
    EXPECT_EQ(slice(after.ht, state, 3 * state), slice(before.ht, state, 3 * state));
  }
}

// The problem with each q/k row copied to the G value heads that read it (H' = HV).
RefProblem with_duplicated_qk(RefProblem const& p) {
  RefProblem d = p;
  int64_t const T = p.shape.num_tokens, H = p.shape.num_qk_heads, HV = p.shape.num_v_heads;
  int64_t const K = p.shape.head_dim_k, G = p.shape.group_size();
  d.shape.num_qk_heads = HV;
  d.q.resize(T * HV * K);
  d.k.resize(T * HV * K);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hv = 0; hv < HV; ++hv)
      for (int64_t i = 0; i < K; ++i) {
        d.q[(t * HV + hv) * K + i] = p.q[(t * H + hv / G) * K + i];
        d.k[(t * HV + hv) * K + i] = p.k[(t * H + hv / G) * K + i];
      }
  return d;
}

// GVA (HV = 2H) equals the plain problem with q/k duplicated per value head; in the backward,
// dq/dk of a q/k head are the sums over its value heads.
TEST(RecurrentForward, GroupedValueHeadsMatchDuplicatedQK) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    int64_t const H = 2, HV = 4, K = 5, V = 3, G = HV / H;
    RefProblem const gva = random_problem(gate, {4, 7}, H, HV, K, V, true, 31);
    RefProblem const dup = with_duplicated_qk(gva);
    Forward const f_gva = run_forward(gva), f_dup = run_forward(dup);
    EXPECT_LT(rel_error(f_gva.o, f_dup.o), 1e-14);
    EXPECT_LT(rel_error(f_gva.ht, f_dup.ht), 1e-14);

    Vec const d_o = random_vector(gva.o_size(), 32), dht = random_vector(gva.state_size(), 33);
    Backward const b_gva = run_backward(gva, d_o, dht), b_dup = run_backward(dup, d_o, dht);
    EXPECT_LT(rel_error(b_gva.dv, b_dup.dv), 1e-14);
    EXPECT_LT(rel_error(b_gva.dg, b_dup.dg), 1e-14);
    EXPECT_LT(rel_error(b_gva.dbeta, b_dup.dbeta), 1e-14);
    EXPECT_LT(rel_error(b_gva.dh0, b_dup.dh0), 1e-14);
    Vec dq_summed(gva.q.size(), 0.0), dk_summed(gva.k.size(), 0.0);
    for (int64_t t = 0; t < gva.shape.num_tokens; ++t)
      for (int64_t hv = 0; hv < HV; ++hv)
        for (int64_t i = 0; i < K; ++i) {
          dq_summed[(t * H + hv / G) * K + i] += b_dup.dq[(t * HV + hv) * K + i];
          dk_summed[(t * H + hv / G) * K + i] += b_dup.dk[(t * HV + hv) * K + i];
        }
    EXPECT_LT(rel_error(b_gva.dq, dq_summed), 1e-14);
    EXPECT_LT(rel_error(b_gva.dk, dk_summed), 1e-14);
  }
}

// A 70-token document run as 30 + 40 tokens, the second half starting from the first half's ht,
// gives the same o and final state as the whole.
TEST(RecurrentForward, StatePassingAcrossSplit) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    RefProblem const whole = random_problem(gate, {70}, 2, 4, 5, 3, true, 41);
    Forward const f_whole = run_forward(whole);

    RefProblem split = whole;
    split.shape.cu_seqlens = {0, 30, 70};
    int64_t const state = whole.state_size();
    split.h0.assign(2 * state, 0.0);
    std::copy(whole.h0.begin(), whole.h0.end(), split.h0.begin());
    Forward const first_pass = run_forward(split);  // only document 0's ht is used
    std::copy(first_pass.ht.begin(), first_pass.ht.begin() + state, split.h0.begin() + state);
    Forward const f_split = run_forward(split);

    EXPECT_LT(rel_error(f_split.o, f_whole.o), 1e-13);
    EXPECT_LT(rel_error(slice(f_split.ht, state, 2 * state), f_whole.ht), 1e-13);
  }
}

// ----- Backward

// Checks every gradient against central differences of L = <o, W_o> + <ht, W_h> (no ht term when
// with_dht is false), along random directions that each cover one document's tokens (or its h0).
void check_gradients(RefProblem p, bool with_dht, uint64_t seed) {
  Vec const W_o = random_vector(p.o_size(), seed);
  Vec const W_h = with_dht ? random_vector(p.state_size(), seed + 1) : Vec();
  Backward const b = run_backward(p, W_o, W_h);
  auto const& cu = p.shape.cu_seqlens;

  // Document n's share of L. A direction that touches only document n moves only this share
  // (documents are independent), and leaving the others out keeps the rounding noise of the
  // finite difference down.
  int64_t const o_per_token = p.shape.num_v_heads * p.shape.head_dim_v;
  int64_t const state = p.state_size() / p.shape.num_seqs();
  auto loss_of_document = [&](int64_t n) {
    Forward const f = run_forward(p);
    double L = 0;
    for (int64_t e = cu[n] * o_per_token; e < cu[n + 1] * o_per_token; ++e) L += f.o[e] * W_o[e];
    if (with_dht)
      for (int64_t e = n * state; e < (n + 1) * state; ++e) L += f.ht[e] * W_h[e];
    return L;
  };

  struct Input {
    char const* name;
    Vec* x;
    Vec const* grad;
    bool per_document;  // h0: one slice per document rather than per token
  };
  Input const inputs[] = {{"q", &p.q, &b.dq, false},    {"k", &p.k, &b.dk, false},
                          {"v", &p.v, &b.dv, false},    {"g", &p.g, &b.dg, false},
                          {"beta", &p.beta, &b.dbeta, false}, {"h0", &p.h0, &b.dh0, true}};
  for (Input const& in : inputs) {
    if (in.x->empty()) continue;
    int64_t const rows = in.per_document ? p.shape.num_seqs() : p.shape.num_tokens;
    int64_t const width = static_cast<int64_t>(in.x->size()) / rows;
    for (int64_t n = 0; n < p.shape.num_seqs(); ++n) {
      int64_t const begin = (in.per_document ? n : cu[n]) * width;
      int64_t const end = (in.per_document ? n + 1 : cu[n + 1]) * width;
      if (begin == end) continue;
      Vec d(in.x->size(), 0.0);
      Vec const r = random_vector(end - begin, seed + 100 * n + 7);
      std::copy(r.begin(), r.end(), d.begin() + begin);
      // eps = 1e-5: in FP64 the central difference's rounding noise (~1e-16 L / eps) still
      // dominates its truncation error (~eps^2), and some directional derivatives are ~1e-2 L.
      double const numeric = cake::testing::directional_derivative(
          *in.x, d, [&] { return loss_of_document(n); }, 1e-5);
      double const analytic = dot(*in.grad, d);
      // <= so that an exact zero passes (dg of a document's first token without h0).
      EXPECT_LE(std::abs(analytic - numeric), 1e-6 * std::abs(numeric))
          << "d" << in.name << " document " << n << ": analytic " << analytic << ", numeric "
          << numeric;
    }
  }
}

// Documents of 1, 3 and 70 tokens (70 crosses the 64-token checkpoint), GVA with G = 2.
RefProblem gradient_problem(Gate gate, bool with_h0, double g_min = -1.0, double g_max = 0.0) {
  return random_problem(gate, {1, 3, 70}, 2, 4, 5, 3, with_h0, 51, g_min, g_max);
}

TEST(RecurrentBackward, GdnMatchesFiniteDifferences) {
  check_gradients(gradient_problem(Gate::kScalar, true), true, 61);
}

TEST(RecurrentBackward, KdaMatchesFiniteDifferences) {
  check_gradients(gradient_problem(Gate::kChannel, true), true, 62);
}

TEST(RecurrentBackward, GdnWithoutInitialStateOrFinalGrad) {
  check_gradients(gradient_problem(Gate::kScalar, false), false, 63);
}

TEST(RecurrentBackward, KdaWithoutInitialStateOrFinalGrad) {
  check_gradients(gradient_problem(Gate::kChannel, false), false, 64);
}

TEST(RecurrentBackward, ZeroDecayMatchesFiniteDifferences) {
  check_gradients(gradient_problem(Gate::kScalar, true, 0.0, 0.0), true, 65);
  check_gradients(gradient_problem(Gate::kChannel, true, 0.0, 0.0), true, 66);
}

// g = -20 per token wipes the state (e^-20 ~ 2e-9): everything stays finite, and o_t is the
// one-token formula scale (q_t . k_t) beta_t v_t up to the wiped remainder.
TEST(RecurrentBackward, StrongDecayStaysFinite) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    SCOPED_TRACE(gate == Gate::kScalar ? "GDN" : "KDA");
    int64_t const H = 2, HV = 4, K = 5, V = 3, G = HV / H;
    RefProblem const p = gradient_problem(gate, true, -20.0, -20.0);
    Forward const f = run_forward(p);
    EXPECT_TRUE(all_finite(f.o));
    EXPECT_TRUE(all_finite(f.ht));

    Vec expected(p.o_size());
    for (int64_t t = 0; t < p.shape.num_tokens; ++t)
      for (int64_t hv = 0; hv < HV; ++hv) {
        double qk = 0;
        for (int64_t i = 0; i < K; ++i)
          qk += p.q[(t * H + hv / G) * K + i] * p.k[(t * H + hv / G) * K + i];
        for (int64_t j = 0; j < V; ++j)
          expected[(t * HV + hv) * V + j] =
              p.scale * qk * p.beta[t * HV + hv] * p.v[(t * HV + hv) * V + j];
      }
    EXPECT_LT(rel_error(f.o, expected), 1e-6);

    Backward const b =
        run_backward(p, random_vector(p.o_size(), 71), random_vector(p.state_size(), 72));
    for (Vec const* grad : {&b.dq, &b.dk, &b.dv, &b.dg, &b.dbeta, &b.dh0})
      EXPECT_TRUE(all_finite(*grad));
  }
}

// Two backward runs agree bit for bit, and every output is overwritten: the second run starts
// from NaN-filled arrays. The zero-length document's dh0 is its dht.
TEST(RecurrentBackward, IsBitwiseReproducible) {
  for (Gate gate : {Gate::kScalar, Gate::kChannel}) {
    RefProblem const p = random_problem(gate, {70, 0, 5, 33}, 2, 4, 5, 3, true, 81);
    Vec const d_o = random_vector(p.o_size(), 82), dht = random_vector(p.state_size(), 83);
    Backward const first = run_backward(p, d_o, dht);
    Backward const second = run_backward(p, d_o, dht, std::numeric_limits<double>::quiet_NaN());
    EXPECT_EQ(first.dq, second.dq);
    EXPECT_EQ(first.dk, second.dk);
    EXPECT_EQ(first.dv, second.dv);
    EXPECT_EQ(first.dg, second.dg);
    EXPECT_EQ(first.dbeta, second.dbeta);
    EXPECT_EQ(first.dh0, second.dh0);
    int64_t const state = p.state_size() / p.shape.num_seqs();
    EXPECT_EQ(slice(first.dh0, state, 2 * state), slice(dht, state, 2 * state));
  }
}

}  // namespace
