// Exact state passing across fragments in FP64: the ground truth of context parallelism.
//
// A fragment is a token range [begin, end) of one document. For one value head it maps its
// incoming state to its final state affinely:
//   S_out = M S_in + B,   M = T_end-1 ... T_begin (K x K),   T_t = (I - beta_t k_t k_t^T) D_t,
//   D_t = exp(g_t) (GDN) or Diag(exp(g_t)) (KDA),   B = the state reached from S_in = 0 (K x V).
// Summaries compose: (M2, B2) o (M1, B1) = (M2 M1, M2 B1 + B2), so the incoming state of piece j
// of a document is (summary j-1 o ... o summary 0) applied to the document's initial state.
//
// Backward, the adjoint of the same map: dS_in = M^T dS_out + C, C = the gradient reaching S_in
// from the fragment's own outputs with dS_out = 0. (M^T, C) is an affine summary too and composes
// the same way, from the document's last piece towards its first.
//
// The within-fragment walks are recurrent_forward / recurrent_backward on the fragment's tokens
// viewed as a one-document problem (no copies: the arrays are token-major).
#pragma once

#include <cstdint>
#include <vector>

#include "ref/problem.hpp"

namespace cake::ref {

// S -> m S + b for one value head.
struct AffineSummary {
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  std::vector<double> m;  // [K, K]
  std::vector<double> b;  // [K, V]
};

AffineSummary identity_summary(int64_t head_dim_k, int64_t head_dim_v);  // (I, 0)

// second o first: S -> second(first(S)) = (m2 m1) S + (m2 b1 + b2).
AffineSummary compose(AffineSummary const& second, AffineSummary const& first);

// m state + b: [K, V] from state [K, V].
std::vector<double> apply(AffineSummary const& summary, double const* state);

// The same for every value head: summaries [HV] (one per head), states [HV, K, V].
std::vector<AffineSummary> compose(std::vector<AffineSummary> const& second,
                                   std::vector<AffineSummary> const& first);
std::vector<double> apply(std::vector<AffineSummary> const& summaries, double const* states);

// The summaries of tokens [begin, end) for every value head: [HV]. M is the state reached from
// S_in = I with v = 0 (the map's linear part), B the one reached from S_in = 0. in.h0 is ignored.
std::vector<AffineSummary> fragment_summary(Shape const& shape, Inputs const& in, int64_t begin,
                                            int64_t end);

// The adjoint summaries of tokens [begin, end) for every value head: [HV], m = M^T [K, K] and
// b = C [K, V], the gradient of S_in from d_o [T, HV, V] (rows [begin, end) read) with dS_out = 0.
std::vector<AffineSummary> fragment_adjoint_summary(Shape const& shape, Inputs const& in,
                                                    double const* d_o, int64_t begin, int64_t end);

// Walks tokens [begin, end) from s_in [HV, K, V] (nullptr: zero): writes rows [begin, end) of o
// [T, HV, V] and, unless nullptr, s_out [HV, K, V]. in.h0 is ignored.
void fragment_forward(Shape const& shape, Inputs const& in, int64_t begin, int64_t end,
                      double const* s_in, double* o, double* s_out);

// The backward of fragment_forward, given d_o [T, HV, V] and ds_out [HV, K, V] (nullptr: zero).
// Writes rows [begin, end) of grad_in's per-token arrays (full [T, ...] arrays) and, unless
// nullptr, grad_in.dh0 = dS_in [HV, K, V].
void fragment_backward(Shape const& shape, Inputs const& in, int64_t begin, int64_t end,
                       double const* s_in, double const* d_o, double const* ds_out,
                       InputGrads const& grad_in);

}  // namespace cake::ref
