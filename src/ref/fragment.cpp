#include "ref/fragment.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "ref/recurrent.hpp"

namespace cake::ref {
namespace {

// Tokens [begin, end) of a problem as a one-document problem of their own: the same heads and
// dims, cu_seqlens = {0, end - begin}, and array views shifted to row `begin` (every array is
// token-major). h0 is left null for the caller to set.
struct FragmentView {
  Shape shape;
  Inputs in;
  int64_t v_offset = 0;  // begin * HV * V: where row `begin` starts in a [T, HV, V] array
};

FragmentView fragment_view(Shape const& shape, Inputs const& in, int64_t begin, int64_t end) {
  CAKE_CHECK(0 <= begin && begin < end && end <= shape.num_tokens, cakeInvalidArgument,
             "fragment [", begin, ", ", end,
             ") must satisfy 0 <= begin < end <= T = ", shape.num_tokens);
  auto const it = std::upper_bound(shape.cu_seqlens.begin(), shape.cu_seqlens.end(), begin);
  CAKE_CHECK(it != shape.cu_seqlens.end() && end <= *it, cakeInvalidArgument, "fragment [", begin,
             ", ", end, ") must lie inside one document, but it crosses cu_seqlens boundary ",
             it == shape.cu_seqlens.end() ? shape.num_tokens : *it);
  int64_t const H = shape.num_qk_heads, HV = shape.num_v_heads;
  int64_t const K = shape.head_dim_k, V = shape.head_dim_v;
  FragmentView view;
  view.v_offset = begin * HV * V;
  view.shape = shape;
  view.shape.num_tokens = end - begin;
  view.shape.cu_seqlens = {0, end - begin};
  view.in = in;
  view.in.q = in.q + begin * H * K;
  view.in.k = in.k + begin * H * K;
  view.in.v = in.v + begin * HV * V;
  view.in.g = in.g + begin * HV * shape.gate_width();
  view.in.beta = in.beta + begin * HV;
  view.in.h0 = nullptr;
  return view;
}

// M [HV, K, K] of the view: the walk of S_in = I with v = 0 (the state space has V = K columns).
std::vector<double> transition(FragmentView const& view) {
  int64_t const HV = view.shape.num_v_heads, K = view.shape.head_dim_k;
  Shape shape = view.shape;
  shape.head_dim_v = K;
  std::vector<double> const zero_v(shape.num_tokens * HV * K, 0.0);
  std::vector<double> identity(HV * K * K, 0.0);
  for (int64_t hv = 0; hv < HV; ++hv) {
    for (int64_t i = 0; i < K; ++i) identity[(hv * K + i) * K + i] = 1.0;
  }
  Inputs in = view.in;
  in.v = zero_v.data();
  in.h0 = identity.data();
  std::vector<double> o(shape.num_tokens * HV * K), m(HV * K * K);
  recurrent_forward(shape, in, {o.data(), m.data()});
  return m;
}

}  // namespace

AffineSummary identity_summary(int64_t head_dim_k, int64_t head_dim_v) {
  AffineSummary s{head_dim_k, head_dim_v, std::vector<double>(head_dim_k * head_dim_k, 0.0),
                  std::vector<double>(head_dim_k * head_dim_v, 0.0)};
  for (int64_t i = 0; i < head_dim_k; ++i) s.m[i * head_dim_k + i] = 1.0;
  return s;
}

AffineSummary compose(AffineSummary const& second, AffineSummary const& first) {
  int64_t const K = first.head_dim_k, V = first.head_dim_v;
  CAKE_CHECK(second.head_dim_k == K && second.head_dim_v == V, cakeInvalidArgument,
             "compose needs summaries of one shape, got [K, V] = [", second.head_dim_k, ", ",
             second.head_dim_v, "] after [", K, ", ", V, "]");
  AffineSummary out{K, V, std::vector<double>(K * K, 0.0), second.b};
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t l = 0; l < K; ++l) {
      double const a = second.m[i * K + l];
      for (int64_t j = 0; j < K; ++j) out.m[i * K + j] += a * first.m[l * K + j];
      for (int64_t j = 0; j < V; ++j) out.b[i * V + j] += a * first.b[l * V + j];
    }
  }
  return out;
}

std::vector<double> apply(AffineSummary const& summary, double const* state) {
  int64_t const K = summary.head_dim_k, V = summary.head_dim_v;
  std::vector<double> out = summary.b;
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t l = 0; l < K; ++l) {
      double const a = summary.m[i * K + l];
      for (int64_t j = 0; j < V; ++j) out[i * V + j] += a * state[l * V + j];
    }
  }
  return out;
}

std::vector<AffineSummary> compose(std::vector<AffineSummary> const& second,
                                   std::vector<AffineSummary> const& first) {
  CAKE_CHECK(second.size() == first.size(), cakeInvalidArgument,
             "compose needs one summary per value head on both sides, got ", second.size(),
             " after ", first.size());
  std::vector<AffineSummary> out;
  for (size_t hv = 0; hv < first.size(); ++hv) out.push_back(compose(second[hv], first[hv]));
  return out;
}

std::vector<double> apply(std::vector<AffineSummary> const& summaries, double const* states) {
  std::vector<double> out;
  int64_t offset = 0;  // of head hv's [K, V] block
  for (AffineSummary const& s : summaries) {
    std::vector<double> const head = apply(s, states + offset);
    out.insert(out.end(), head.begin(), head.end());
    offset += s.head_dim_k * s.head_dim_v;
  }
  return out;
}

std::vector<AffineSummary> fragment_summary(Shape const& shape, Inputs const& in, int64_t begin,
                                            int64_t end) {
  FragmentView const view = fragment_view(shape, in, begin, end);
  int64_t const HV = shape.num_v_heads, K = shape.head_dim_k, V = shape.head_dim_v;
  std::vector<double> o(view.shape.num_tokens * HV * V), b(HV * K * V);
  recurrent_forward(view.shape, view.in, {o.data(), b.data()});
  std::vector<double> const m = transition(view);
  std::vector<AffineSummary> out(HV);
  for (int64_t hv = 0; hv < HV; ++hv) {
    out[hv] = {K, V, std::vector<double>(m.begin() + hv * K * K, m.begin() + (hv + 1) * K * K),
               std::vector<double>(b.begin() + hv * K * V, b.begin() + (hv + 1) * K * V)};
  }
  return out;
}

std::vector<AffineSummary> fragment_adjoint_summary(Shape const& shape, Inputs const& in,
                                                    double const* d_o, int64_t begin, int64_t end) {
  FragmentView const view = fragment_view(shape, in, begin, end);
  int64_t const L = view.shape.num_tokens, H = shape.num_qk_heads, HV = shape.num_v_heads;
  int64_t const K = shape.head_dim_k, V = shape.head_dim_v;
  // C: the backward from a zero S_in (the gradient of S_in does not depend on S_in, the map being
  // affine) with dS_out = 0; the per-token gradients are scratch.
  std::vector<double> dq(L * H * K), dk(L * H * K), dv(L * HV * V);
  std::vector<double> dg(L * HV * shape.gate_width()), dbeta(L * HV), c(HV * K * V);
  recurrent_backward(view.shape, view.in, {d_o + view.v_offset, nullptr},
                     {dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), c.data()});
  std::vector<double> const m = transition(view);
  std::vector<AffineSummary> out(HV);
  for (int64_t hv = 0; hv < HV; ++hv) {
    AffineSummary& s = out[hv];
    s = {K, V, std::vector<double>(K * K),
         std::vector<double>(c.begin() + hv * K * V, c.begin() + (hv + 1) * K * V)};
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t j = 0; j < K; ++j) s.m[i * K + j] = m[(hv * K + j) * K + i];
    }
  }
  return out;
}

void fragment_forward(Shape const& shape, Inputs const& in, int64_t begin, int64_t end,
                      double const* s_in, double* o, double* s_out) {
  FragmentView view = fragment_view(shape, in, begin, end);
  view.in.h0 = s_in;
  recurrent_forward(view.shape, view.in, {o + view.v_offset, s_out});
}

void fragment_backward(Shape const& shape, Inputs const& in, int64_t begin, int64_t end,
                       double const* s_in, double const* d_o, double const* ds_out,
                       InputGrads const& grad_in) {
  FragmentView view = fragment_view(shape, in, begin, end);
  view.in.h0 = s_in;
  int64_t const H = shape.num_qk_heads, HV = shape.num_v_heads, K = shape.head_dim_k;
  InputGrads rows = grad_in;
  rows.dq = grad_in.dq + begin * H * K;
  rows.dk = grad_in.dk + begin * H * K;
  rows.dv = grad_in.dv + view.v_offset;
  rows.dg = grad_in.dg + begin * HV * shape.gate_width();
  rows.dbeta = grad_in.dbeta + begin * HV;
  recurrent_backward(view.shape, view.in, {d_o + view.v_offset, ds_out}, rows);
}

}  // namespace cake::ref
