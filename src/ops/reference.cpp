// CPU tensors in any float dtype -> FP64 arrays -> optional transforms (q/k L2 norm, gate, beta
// sigmoid) -> the chunked FP64 reference -> results rounded into the output tensors' dtypes.
// The backward recomputes the transforms and runs their backward after the core's.
#include "ops/reference.hpp"

#include <optional>
#include <vector>

#include "core/tensor.hpp"
#include "ref/chunked.hpp"
#include "ref/preprocess.hpp"

namespace cake::ops {

namespace {

// The forward's inputs in FP64, after the optional transforms, plus what their backward needs.
struct Prepared {
  ref::Shape shape;
  std::vector<double> q, k, v, g, beta, h0;
  std::vector<double> q_rstd, k_rstd;  // with use_qk_l2norm: 1 / ||x|| per token and head
  std::vector<double> g_raw;           // with use_gate_in_kernel
  ref::GateParams gate;
  std::vector<double> beta_raw;  // with use_beta_sigmoid
  double beta_c = 1.0;           // beta = beta_c * sigmoid(beta_raw)

  ref::Inputs inputs(double scale) const {
    return {q.data(), k.data(), v.data(), g.data(), beta.data(), h0.empty() ? nullptr : h0.data(),
            scale};
  }
};

std::vector<int64_t> document_offsets(cakeTensor_t const& cu_seqlens, Dims const& d) {
  if (present(cu_seqlens)) return to_int64(cu_seqlens);
  // B rows of T tokens are B documents of a [B * T] pack, since the layout is token-major.
  std::vector<int64_t> cu(d.batch + 1);
  for (int64_t b = 0; b <= d.batch; ++b) cu[b] = b * d.seq_len;
  return cu;
}

Prepared prepare(cakeOptions_t const& options, cakeTensor_t const& q, cakeTensor_t const& k,
                 cakeTensor_t const& v, cakeTensor_t const& g, cakeTensor_t const& beta,
                 cakeTensor_t const& initial_state, cakeTensor_t const& cu_seqlens,
                 cakeTensor_t const& A_log, cakeTensor_t const& dt_bias, Dims const& d) {
  Prepared p;
  p.shape.gate = options.variant == cakeKda ? ref::Gate::kChannel : ref::Gate::kScalar;
  p.shape.num_tokens = d.batch * d.seq_len;
  p.shape.num_qk_heads = d.num_qk_heads;
  p.shape.num_v_heads = d.num_v_heads;
  p.shape.head_dim_k = d.head_dim_k;
  p.shape.head_dim_v = d.head_dim_v;
  p.shape.cu_seqlens = document_offsets(cu_seqlens, d);

  if (options.use_qk_l2norm) {
    ref::l2norm_forward(to_double(q), d.head_dim_k, p.q, p.q_rstd);
    ref::l2norm_forward(to_double(k), d.head_dim_k, p.k, p.k_rstd);
  } else {
    p.q = to_double(q);
    p.k = to_double(k);
  }
  p.v = to_double(v);
  if (options.use_gate_in_kernel) {
    p.gate.num_v_heads = d.num_v_heads;
    p.gate.width = p.shape.gate_width();
    if (present(A_log)) p.gate.A_log = to_double(A_log);
    if (present(dt_bias)) p.gate.dt_bias = to_double(dt_bias);
    if (options.has_lower_bound) p.gate.lower_bound = options.lower_bound;
    p.g_raw = to_double(g);
    p.g = ref::gate_forward(p.gate, p.g_raw);
  } else {
    p.g = to_double(g);
  }
  if (options.use_beta_sigmoid) {
    p.beta_c = options.allow_neg_eigval ? 2.0 : 1.0;
    p.beta_raw = to_double(beta);
    p.beta = ref::beta_sigmoid_forward(p.beta_raw, p.beta_c);
  } else {
    p.beta = to_double(beta);
  }
  if (present(initial_state)) p.h0 = to_double(initial_state);
  return p;
}

}  // namespace

void reference_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, Dims const& d) {
  Prepared const p = prepare(options, args.q, args.k, args.v, args.g, args.beta, args.initial_state,
                             args.cu_seqlens, args.A_log, args.dt_bias, d);
  std::vector<double> o(numel(args.o));
  std::vector<double> ht(present(args.final_state) ? numel(args.final_state) : 0);
  ref::chunked_forward(p.shape, p.inputs(options.scale),
                       {o.data(), ht.empty() ? nullptr : ht.data()});
  from_double(o, args.o);
  if (!ht.empty()) from_double(ht, args.final_state);
}

void reference_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                        Dims const& d) {
  Prepared const p = prepare(options, args.q, args.k, args.v, args.g, args.beta, args.initial_state,
                             args.cu_seqlens, args.A_log, args.dt_bias, d);
  std::vector<double> const d_o = to_double(args.dout);
  std::vector<double> const dht = present(args.dht) ? to_double(args.dht) : std::vector<double>{};
  std::vector<double> dq(p.q.size()), dk(p.k.size()), dv(p.v.size()), dg(p.g.size()),
      dbeta(p.beta.size()), dh0(p.h0.size());
  ref::chunked_backward(p.shape, p.inputs(options.scale),
                        {d_o.data(), dht.empty() ? nullptr : dht.data()},
                        {dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(),
                         dh0.empty() ? nullptr : dh0.data()});

  // Back through the transforms, then out in each gradient's dtype.
  if (options.use_qk_l2norm) {
    dq = ref::l2norm_backward(dq, p.q, p.q_rstd, d.head_dim_k);
    dk = ref::l2norm_backward(dk, p.k, p.k_rstd, d.head_dim_k);
  }
  std::vector<double> dA_log, ddt_bias;
  if (options.use_gate_in_kernel) {
    ref::GateGrads gate = ref::gate_backward(p.gate, p.g_raw, dg);
    dg = std::move(gate.dg_raw);
    dA_log = std::move(gate.dA_log);
    ddt_bias = std::move(gate.ddt_bias);
  }
  if (options.use_beta_sigmoid) dbeta = ref::beta_sigmoid_backward(p.beta_raw, p.beta_c, dbeta);

  if (present(args.dq)) from_double(dq, args.dq);
  if (present(args.dk)) from_double(dk, args.dk);
  if (present(args.dv)) from_double(dv, args.dv);
  if (present(args.dg)) from_double(dg, args.dg);
  if (present(args.dbeta)) from_double(dbeta, args.dbeta);
  if (present(args.dh0)) from_double(dh0, args.dh0);
  if (present(args.dA_log)) from_double(dA_log, args.dA_log);
  if (present(args.ddt_bias)) from_double(ddt_bias, args.ddt_bias);
}

}  // namespace cake::ops
