// Token-by-token recurrence in FP64 (recurrent.hpp): forward, and its analytic backward.
//
// One work item is one (document n, value head hv) pair; it reads q/k head h = hv / G.
// Per token t, with S the K x V state (row-major, S[i * V + j]):
//   Sbar = D_t S_{t-1}     p = Sbar^T k_t     delta = beta_t (v_t - p)
//   S_t = Sbar + k_t delta^T     o_t = scale S_t^T q_t
// D_t = exp(g_t) (GDN) or Diag(exp(g_t)) (KDA: row i of S scaled by exp(g_t[i])).
#include "ref/recurrent.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "ref/parallel.hpp"

namespace cake::ref {
namespace {

// The backward keeps S_{t-1} at every kCheckpointInterval-th token of a document and recomputes
// the states of one such block at a time before walking it in reverse.
constexpr int64_t kCheckpointInterval = 64;

// ----- Small dense pieces. S is K x V row-major; x, dk are K-vectors; y, p, delta are V-vectors.

// S <- D_t S. D_t is diagonal (or scalar), so the same call also maps dSbar to dS_{t-1}.
void apply_decay(double* S, double const* g, Gate gate, int64_t K, int64_t V) {
  for (int64_t i = 0; i < K; ++i) {
    double const a = std::exp(gate == Gate::kScalar ? g[0] : g[i]);
    for (int64_t j = 0; j < V; ++j) S[i * V + j] *= a;
  }
}

// y = alpha S^T x (V-vector).
void transpose_times(double const* S, double const* x, double alpha, int64_t K, int64_t V,
                     double* y) {
  std::fill(y, y + V, 0.0);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < V; ++j) y[j] += S[i * V + j] * x[i];
  for (int64_t j = 0; j < V; ++j) y[j] *= alpha;
}

// x += alpha S y (K-vector).
void add_times(double const* S, double const* y, double alpha, int64_t K, int64_t V, double* x) {
  for (int64_t i = 0; i < K; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += S[i * V + j] * y[j];
    x[i] += alpha * sum;
  }
}

// S += alpha a b^T, a a K-vector and b a V-vector.
void add_outer(double* S, double const* a, double const* b, double alpha, int64_t K, int64_t V) {
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < V; ++j) S[i * V + j] += alpha * a[i] * b[j];
}

// ----- One (document, value head) pair and where it finds its rows in the token-major arrays.

struct Head {
  Shape const& shape;
  int64_t n, hv, h;  // document, value head, q/k head
  int64_t begin, end;  // tokens [begin, end)

  Head(Shape const& s, int64_t item)
      : shape(s),
        n(item / s.num_v_heads),
        hv(item % s.num_v_heads),
        h(hv / s.group_size()),
        begin(s.cu_seqlens[n]),
        end(s.cu_seqlens[n + 1]) {}

  int64_t K() const { return shape.head_dim_k; }
  int64_t V() const { return shape.head_dim_v; }
  int64_t state_size() const { return K() * V(); }
  int64_t qk_offset(int64_t t) const { return (t * shape.num_qk_heads + h) * K(); }  // [T,H,K]
  int64_t v_offset(int64_t t) const { return (t * shape.num_v_heads + hv) * V(); }   // [T,HV,V]
  int64_t g_offset(int64_t t) const {  // [T,HV] or [T,HV,K]
    return (t * shape.num_v_heads + hv) * shape.gate_width();
  }
  int64_t beta_offset(int64_t t) const { return t * shape.num_v_heads + hv; }  // [T,HV]
  int64_t state_offset() const {  // [N,HV,K,V]
    return (n * shape.num_v_heads + hv) * state_size();
  }
};

// S_{t-1} -> Sbar in place; p = Sbar^T k_t and delta = beta_t (v_t - p).
void predict(Head const& head, Inputs const& in, int64_t t, double* S, double* p, double* delta) {
  int64_t const K = head.K(), V = head.V();
  apply_decay(S, in.g + head.g_offset(t), head.shape.gate, K, V);
  transpose_times(S, in.k + head.qk_offset(t), 1.0, K, V, p);
  double const beta = in.beta[head.beta_offset(t)];
  double const* v = in.v + head.v_offset(t);
  for (int64_t j = 0; j < V; ++j) delta[j] = beta * (v[j] - p[j]);
}

// S_{t-1} -> S_t in place (p and delta are scratch V-vectors).
void step(Head const& head, Inputs const& in, int64_t t, double* S, double* p, double* delta) {
  predict(head, in, t, S, p, delta);
  add_outer(S, in.k + head.qk_offset(t), delta, 1.0, head.K(), head.V());
}

// The document's initial state: h0[n, hv], or zero.
std::vector<double> initial_state(Head const& head, Inputs const& in) {
  std::vector<double> S(head.state_size(), 0.0);
  if (in.h0 != nullptr) std::copy_n(in.h0 + head.state_offset(), S.size(), S.begin());
  return S;
}

void forward_head(Head const& head, Inputs const& in, Outputs const& out) {
  int64_t const V = head.V();
  std::vector<double> S = initial_state(head, in);
  std::vector<double> p(V), delta(V);
  for (int64_t t = head.begin; t < head.end; ++t) {
    step(head, in, t, S.data(), p.data(), delta.data());
    transpose_times(S.data(), in.q + head.qk_offset(t), in.scale, head.K(), V,
                    out.o + head.v_offset(t));
  }
  if (out.ht != nullptr) std::copy(S.begin(), S.end(), out.ht + head.state_offset());
}

// Reverse-mode through one document. dq, dk go to scratch arrays of shape [T, HV, K] (this value
// head's share); the caller sums them over each q/k head's value heads.
void backward_head(Head const& head, Inputs const& in, OutputGrads const& grad_out,
                   InputGrads const& grad_in, double* dq_per_v_head, double* dk_per_v_head) {
  int64_t const K = head.K(), V = head.V(), KV = head.state_size();
  int64_t const length = head.end - head.begin;
  int64_t const num_blocks = (length + kCheckpointInterval - 1) / kCheckpointInterval;
  // Slot of token t in the [T, HV, K] scratch arrays.
  auto scratch_offset = [&](int64_t t) { return (t * head.shape.num_v_heads + head.hv) * K; };

  std::vector<double> p(V), delta(V), ddelta(V), dp(V), v_minus_p(V);

  // Forward re-walk keeping S_{t-1} at the first token of every block: [num_blocks][K*V].
  std::vector<std::vector<double>> checkpoints;
  checkpoints.reserve(num_blocks);
  std::vector<double> S = initial_state(head, in);
  for (int64_t t = head.begin; t < head.end; ++t) {
    if ((t - head.begin) % kCheckpointInterval == 0) checkpoints.push_back(S);
    step(head, in, t, S.data(), p.data(), delta.data());
  }

  // dS: gradient of S_t for the token t being walked, from o_{t+1..} and ht; starts at dht.
  std::vector<double> dS(KV, 0.0);
  if (grad_out.dht != nullptr) std::copy_n(grad_out.dht + head.state_offset(), KV, dS.begin());

  // states[i] = S before the block's i-th token; states[i + 1] = S after it.
  std::vector<std::vector<double>> states(kCheckpointInterval + 1);
  std::vector<double> Sbar(KV);
  for (int64_t block = num_blocks - 1; block >= 0; --block) {
    int64_t const block_begin = head.begin + block * kCheckpointInterval;
    int64_t const block_end = std::min(head.end, block_begin + kCheckpointInterval);
    states[0] = checkpoints[block];
    for (int64_t t = block_begin; t < block_end; ++t) {
      int64_t const i = t - block_begin;
      states[i + 1] = states[i];
      step(head, in, t, states[i + 1].data(), p.data(), delta.data());
    }

    for (int64_t t = block_end - 1; t >= block_begin; --t) {
      int64_t const i = t - block_begin;
      double const* q = in.q + head.qk_offset(t);
      double const* k = in.k + head.qk_offset(t);
      double const* v = in.v + head.v_offset(t);
      double const* d_o = grad_out.d_o + head.v_offset(t);
      double const beta = in.beta[head.beta_offset(t)];
      double const* S_t = states[i + 1].data();
      std::copy(states[i].begin(), states[i].end(), Sbar.begin());
      predict(head, in, t, Sbar.data(), p.data(), delta.data());

      // o_t = scale S_t^T q_t: dq_t = scale S_t do_t, and dS (of S_t) gains scale q_t do_t^T.
      double* dq = dq_per_v_head + scratch_offset(t);
      std::fill(dq, dq + K, 0.0);
      add_times(S_t, d_o, in.scale, K, V, dq);
      add_outer(dS.data(), q, d_o, in.scale, K, V);

      // S_t = Sbar + k delta^T: dk_t = dS delta, ddelta = dS^T k (dSbar = dS so far).
      double* dk = dk_per_v_head + scratch_offset(t);
      std::fill(dk, dk + K, 0.0);
      add_times(dS.data(), delta.data(), 1.0, K, V, dk);
      transpose_times(dS.data(), k, 1.0, K, V, ddelta.data());

      // delta = beta (v - p): dv = beta ddelta, dp = -beta ddelta, dbeta = <ddelta, v - p>.
      for (int64_t j = 0; j < V; ++j) {
        v_minus_p[j] = v[j] - p[j];
        dp[j] = -beta * ddelta[j];
        grad_in.dv[head.v_offset(t) + j] = beta * ddelta[j];
      }
      grad_in.dbeta[head.beta_offset(t)] = std::inner_product(
          ddelta.begin(), ddelta.end(), v_minus_p.begin(), 0.0);

      // p = Sbar^T k: dSbar += k dp^T (dS now holds dSbar), dk_t += Sbar dp.
      add_outer(dS.data(), k, dp.data(), 1.0, K, V);
      add_times(Sbar.data(), dp.data(), 1.0, K, V, dk);

      // Sbar = D_t S_{t-1}: d(exp(g) x)/dg = exp(g) x, so dg sums Sbar .* dSbar (over row i for
      // KDA's g_t[i], over all of it for GDN), and dS_{t-1} = D_t dSbar.
      double* dg = grad_in.dg + head.g_offset(t);
      std::fill(dg, dg + head.shape.gate_width(), 0.0);
      for (int64_t r = 0; r < K; ++r) {
        double row = 0;
        for (int64_t j = 0; j < V; ++j) row += Sbar[r * V + j] * dS[r * V + j];
        dg[head.shape.gate == Gate::kScalar ? 0 : r] += row;
      }
      apply_decay(dS.data(), in.g + head.g_offset(t), head.shape.gate, K, V);
    }
  }
  if (grad_in.dh0 != nullptr) std::copy(dS.begin(), dS.end(), grad_in.dh0 + head.state_offset());
}

}  // namespace

void recurrent_forward(Shape const& shape, Inputs const& in, Outputs const& out) {
  parallel_for(shape.num_seqs() * shape.num_v_heads,
               [&](int64_t item) { forward_head(Head(shape, item), in, out); });
}

void recurrent_backward(Shape const& shape, Inputs const& in, OutputGrads const& grad_out,
                        InputGrads const& grad_in) {
  int64_t const T = shape.num_tokens, H = shape.num_qk_heads, HV = shape.num_v_heads;
  int64_t const K = shape.head_dim_k, G = shape.group_size();
  // Per-value-head dq, dk [T, HV, K]: workers write disjoint slices, then a fixed-order sum.
  std::vector<double> dq_per_v_head(T * HV * K, 0.0), dk_per_v_head(T * HV * K, 0.0);
  parallel_for(shape.num_seqs() * HV, [&](int64_t item) {
    backward_head(Head(shape, item), in, grad_out, grad_in, dq_per_v_head.data(),
                  dk_per_v_head.data());
  });

  // dq[t, h] = sum over hv = h G .. h G + G - 1, ascending, so the result never depends on
  // how the work was split between threads.
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      double* dq = grad_in.dq + (t * H + h) * K;
      double* dk = grad_in.dk + (t * H + h) * K;
      std::fill(dq, dq + K, 0.0);
      std::fill(dk, dk + K, 0.0);
      for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
        for (int64_t i = 0; i < K; ++i) {
          dq[i] += dq_per_v_head[(t * HV + hv) * K + i];
          dk[i] += dk_per_v_head[(t * HV + hv) * K + i];
        }
      }
    }
  }
}

}  // namespace cake::ref
