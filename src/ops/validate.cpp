#include "ops/validate.hpp"

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "ops/checks.hpp"

namespace cake::ops {

namespace {

// The inputs and options shared by the forward and the backward.
struct Inputs {
  cakeTensor_t const& q;
  cakeTensor_t const& k;
  cakeTensor_t const& v;
  cakeTensor_t const& g;
  cakeTensor_t const& beta;
  cakeTensor_t const& initial_state;
  cakeTensor_t const& cu_seqlens;
  cakeTensor_t const& A_log;
  cakeTensor_t const& dt_bias;
};

// The forward's inputs by name (the backward takes them unchanged, under the same names).
template <typename Args>
std::vector<NamedTensor> forward_inputs(Args const& args) {
  return {{"q", &args.q},
          {"k", &args.k},
          {"v", &args.v},
          {"g", &args.g},
          {"beta", &args.beta},
          {"initial_state", &args.initial_state},
          {"cu_seqlens", &args.cu_seqlens},
          {"A_log", &args.A_log},
          {"dt_bias", &args.dt_bias}};
}

void check_options(cakeOptions_t const* options) {
  CAKE_CHECK(options != nullptr, cakeInvalidArgument, "options must not be NULL");
  CAKE_CHECK(options->struct_size == sizeof(cakeOptions_t), cakeInvalidArgument,
             "options.struct_size must be sizeof(cakeOptions_t) = ", sizeof(cakeOptions_t),
             ", got ", options->struct_size);
  CAKE_CHECK(options->variant == cakeGdn || options->variant == cakeKda, cakeInvalidArgument,
             "options.variant must be cakeGdn (0) or cakeKda (1), got ",
             static_cast<int>(options->variant));
  CAKE_CHECK(std::isfinite(options->scale), cakeInvalidArgument,
             "scale must be a finite number, got ", options->scale);
  CAKE_CHECK(options->save_for_backward >= 0 && options->save_for_backward <= 2,
             cakeInvalidArgument,
             "options.save_for_backward must be 0 (recompute mode), 1 (saved mode) or 2 (inverse "
             "mode), got ",
             options->save_for_backward);
  CAKE_CHECK(!options->allow_neg_eigval || options->use_beta_sigmoid, cakeInvalidArgument,
             "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True");
  if (options->has_lower_bound) {
    CAKE_CHECK(options->variant == cakeKda, cakeInvalidArgument,
               "lower_bound applies to chunk_kda only, got lower_bound=", options->lower_bound,
               " for chunk_gated_delta_rule");
    CAKE_CHECK(std::isfinite(options->lower_bound) && options->lower_bound < 0, cakeInvalidArgument,
               "lower_bound must be a finite negative number, got ", options->lower_bound);
    // The bound is a form of the in-op gate; without it g is taken as given, so a bound there
    // would be ignored without a word.
    CAKE_CHECK(options->use_gate_in_kernel, cakeInvalidArgument,
               "lower_bound is a form of the in-op gate: it needs use_gate_in_kernel, got "
               "lower_bound=",
               options->lower_bound, " without it");
  }
}

Dims check_inputs(cakeOptions_t const& options, Inputs const& in) {
  bool const kda = options.variant == cakeKda;
  check_present("q", in.q);
  CAKE_CHECK(in.q.ndim == 4, cakeInvalidArgument,
             "q must have 4 dimensions [B, T, H, K], got shape ", cake::shape_string(in.q));
  for (auto [name, t] : {std::pair<char const*, cakeTensor_t const*>{"q", &in.q}, {"v", &in.v}}) {
    for (int dim = 0; dim < t->ndim; ++dim) {
      CAKE_CHECK(t->shape[dim] >= 0, cakeInvalidArgument, name,
                 " must have non-negative sizes, got shape ", cake::shape_string(*t));
    }
  }
  Dims d;
  d.batch = in.q.shape[0];
  d.seq_len = in.q.shape[1];
  d.num_qk_heads = in.q.shape[2];
  d.head_dim_k = in.q.shape[3];
  d.device_type = in.q.device_type;
  CAKE_CHECK(d.device_type == cakeCPU || d.device_type == cakeCUDA, cakeInvalidArgument,
             "q must be on the CPU or a CUDA device, got ", device_string(in.q));
  check_present("k", in.k);
  check_shape("k", in.k, {d.batch, d.seq_len, d.num_qk_heads, d.head_dim_k}, "[B, T, H, K] (as q)");
  check_present("v", in.v);
  CAKE_CHECK(in.v.ndim == 4 && in.v.shape[0] == d.batch && in.v.shape[1] == d.seq_len,
             cakeInvalidArgument, "v must have shape [B, T, HV, V] with B = ", d.batch,
             " and T = ", d.seq_len, " (from q), got ", cake::shape_string(in.v));
  d.num_v_heads = in.v.shape[2];
  d.head_dim_v = in.v.shape[3];
  CAKE_CHECK(d.num_qk_heads > 0 && d.num_v_heads > 0 && d.num_v_heads % d.num_qk_heads == 0,
             cakeInvalidArgument, "the number of value heads HV (v.shape[2] = ", d.num_v_heads,
             ") must be a positive multiple of the number of q/k heads H (q.shape[2] = ",
             d.num_qk_heads, ")");
  check_present("g", in.g);
  if (kda) {
    check_shape("g", in.g, {d.batch, d.seq_len, d.num_v_heads, d.head_dim_k},
                "[B, T, HV, K] for chunk_kda");
  } else {
    check_shape("g", in.g, {d.batch, d.seq_len, d.num_v_heads},
                "[B, T, HV] for chunk_gated_delta_rule");
  }
  check_present("beta", in.beta);
  check_shape("beta", in.beta, {d.batch, d.seq_len, d.num_v_heads}, "[B, T, HV]");

  for (auto [name, t] : {std::pair<char const*, cakeTensor_t const*>{"q", &in.q},
                         {"k", &in.k},
                         {"v", &in.v},
                         {"g", &in.g},
                         {"beta", &in.beta}}) {
    check_float(name, *t);
  }
  CAKE_CHECK(in.k.dtype == in.q.dtype && in.v.dtype == in.q.dtype, cakeInvalidArgument,
             "q, k and v must have the same dtype, got q ", dtype_name(in.q.dtype), ", k ",
             dtype_name(in.k.dtype), ", v ", dtype_name(in.v.dtype));

  d.num_seqs = present(in.cu_seqlens) ? check_cu_seqlens(in.cu_seqlens, d.batch) : d.batch;
  if (present(in.initial_state)) {
    check_float("initial_state", in.initial_state);
    check_shape("initial_state", in.initial_state,
                {d.num_seqs, d.num_v_heads, d.head_dim_k, d.head_dim_v}, "[N, HV, K, V]");
  }

  if (options.use_gate_in_kernel) {
    bool const needs_A_log = !options.has_lower_bound;
    if (needs_A_log) {
      CAKE_CHECK(present(in.A_log), cakeInvalidArgument,
                 "A_log [HV] is required with use_gate_in_kernel=True",
                 kda ? " (unless lower_bound is set)" : "");
    }
    if (present(in.A_log)) {
      check_float("A_log", in.A_log);
      check_shape("A_log", in.A_log, {d.num_v_heads}, "[HV]");
    }
    if (present(in.dt_bias)) {
      check_float("dt_bias", in.dt_bias);
      if (kda) {
        check_shape("dt_bias", in.dt_bias, {d.num_v_heads * d.head_dim_k}, "[HV * K]");
      } else {
        check_shape("dt_bias", in.dt_bias, {d.num_v_heads}, "[HV]");
      }
    }
  } else {
    CAKE_CHECK(!present(in.A_log) && !present(in.dt_bias), cakeInvalidArgument,
               "A_log and dt_bias are only used with use_gate_in_kernel=True; got ",
               present(in.A_log) ? "A_log" : "dt_bias", " with use_gate_in_kernel=False");
  }

  // Every tensor on q's device.
  for (auto [name, t] : forward_inputs(in)) {
    if (t != &in.q && present(*t)) check_same_device(name, *t, "q", in.q);
  }

  // Contents of cu_seqlens, read where they live on the host. CUDA offsets are not read here:
  // that would synchronise the device with the host (cake.h says so).
  if (present(in.cu_seqlens) && d.device_type == cakeCPU) {
    check_cu_seqlens_contents(in.cu_seqlens, d.seq_len);
  }

  return d;
}

}  // namespace

Dims validate_forward(cakeOptions_t const* options, cakeForwardArgs_t const* args) {
  check_options(options);
  CAKE_CHECK(args != nullptr, cakeInvalidArgument, "args must not be NULL");
  Dims const d =
      check_inputs(*options, {args->q, args->k, args->v, args->g, args->beta, args->initial_state,
                              args->cu_seqlens, args->A_log, args->dt_bias});
  check_present("o", args->o);
  check_output("o", args->o, {d.batch, d.seq_len, d.num_v_heads, d.head_dim_v}, "[B, T, HV, V]",
               "q", args->q);
  if (present(args->final_state)) {
    check_output("final_state", args->final_state,
                 {d.num_seqs, d.num_v_heads, d.head_dim_k, d.head_dim_v}, "[N, HV, K, V]", "q",
                 args->q);
  }
  return d;
}

Dims validate_backward(cakeOptions_t const* options, cakeBackwardArgs_t const* args) {
  check_options(options);
  CAKE_CHECK(args != nullptr, cakeInvalidArgument, "args must not be NULL");
  Dims const d =
      check_inputs(*options, {args->q, args->k, args->v, args->g, args->beta, args->initial_state,
                              args->cu_seqlens, args->A_log, args->dt_bias});
  std::vector<int64_t> const qk = {d.batch, d.seq_len, d.num_qk_heads, d.head_dim_k};
  std::vector<int64_t> const vo = {d.batch, d.seq_len, d.num_v_heads, d.head_dim_v};
  std::vector<int64_t> const state = {d.num_seqs, d.num_v_heads, d.head_dim_k, d.head_dim_v};
  std::vector<int64_t> const row = {d.batch, d.seq_len, d.num_v_heads};
  std::vector<int64_t> const gate =
      options->variant == cakeKda
          ? std::vector<int64_t>{d.batch, d.seq_len, d.num_v_heads, d.head_dim_k}
          : row;
  cakeTensor_t const& q = args->q;

  check_present("dout", args->dout);
  check_output("dout", args->dout, vo, "[B, T, HV, V] (as o)", "q", q);
  if (present(args->dht)) check_output("dht", args->dht, state, "[N, HV, K, V]", "q", q);

  check_optional_output("dq", args->dq, true, "", qk, "[B, T, H, K] (as q)", "q", q);
  check_optional_output("dk", args->dk, true, "", qk, "[B, T, H, K] (as k)", "q", q);
  check_optional_output("dv", args->dv, true, "", vo, "[B, T, HV, V] (as v)", "q", q);
  check_optional_output("dg", args->dg, true, "", gate, "(as g)", "q", q);
  check_optional_output("dbeta", args->dbeta, true, "", row, "[B, T, HV] (as beta)", "q", q);
  check_optional_output("dh0", args->dh0, present(args->initial_state), "an initial_state", state,
                        "[N, HV, K, V] (as initial_state)", "q", q);
  check_optional_output("dA_log", args->dA_log, present(args->A_log), "A_log", {d.num_v_heads},
                        "[HV] (as A_log)", "q", q);
  check_optional_output("ddt_bias", args->ddt_bias, present(args->dt_bias), "dt_bias",
                        {numel(args->dt_bias)}, "(as dt_bias)", "q", q);
  return d;
}

void validate_saved(cakeOptions_t const& options, void const* saved, size_t saved_bytes,
                    size_t expected_bytes) {
  CAKE_CHECK(saved != nullptr || saved_bytes == 0, cakeInvalidArgument,
             "saved is NULL but saved_bytes = ", saved_bytes, " (pass 0 with a NULL buffer)");
  if (options.save_for_backward == 0) {
    CAKE_CHECK(saved == nullptr, cakeInvalidArgument,
               "saved must be NULL in recompute mode (options.save_for_backward = 0), got a "
               "buffer of ",
               saved_bytes, " bytes");
    return;
  }
  CAKE_CHECK(saved_bytes >= expected_bytes, cakeInsufficientWorkspace, "saved: expected at least ",
             expected_bytes, " bytes (cakeForwardSavedSize) with options.save_for_backward = ",
             options.save_for_backward, ", got ", saved_bytes);
}

void check_forward_apart(cakeForwardArgs_t const& args) {
  check_no_overlap({{"o", &args.o}, {"final_state", &args.final_state}}, forward_inputs(args));
}

void check_backward_apart(cakeBackwardArgs_t const& args) {
  std::vector<NamedTensor> inputs = forward_inputs(args);
  inputs.insert(inputs.end(), {{"dout", &args.dout}, {"dht", &args.dht}});
  check_no_overlap({{"dq", &args.dq},
                    {"dk", &args.dk},
                    {"dv", &args.dv},
                    {"dg", &args.dg},
                    {"dbeta", &args.dbeta},
                    {"dh0", &args.dh0},
                    {"dA_log", &args.dA_log},
                    {"ddt_bias", &args.ddt_bias}},
                   inputs);
}

}  // namespace cake::ops
