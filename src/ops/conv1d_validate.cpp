#include "ops/conv1d_validate.hpp"

#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "ops/checks.hpp"

namespace cake::ops {

namespace {

void check_header(size_t struct_size, size_t expected, char const* type, int32_t activation) {
  CAKE_CHECK(struct_size == expected, cakeInvalidArgument, "args.struct_size must be sizeof(", type,
             ") = ", expected, ", got ", struct_size);
  CAKE_CHECK(
      activation == cakeActivationNone || activation == cakeActivationSilu, cakeInvalidArgument,
      "activation must be cakeActivationNone (0) or cakeActivationSilu (1), got ", activation);
}

// The inputs shared by the forward and the backward.
Conv1dDims check_inputs(cakeTensor_t const& x, cakeTensor_t const& weight, cakeTensor_t const& bias,
                        cakeTensor_t const& initial_state, cakeTensor_t const& cu_seqlens) {
  check_present("x", x);
  CAKE_CHECK(x.ndim == 3, cakeInvalidArgument, "x must have 3 dimensions [B, T, D], got shape ",
             shape_string(x));
  for (int dim = 0; dim < 3; ++dim) {
    CAKE_CHECK(x.shape[dim] >= 0, cakeInvalidArgument, "x must have non-negative sizes, got shape ",
               shape_string(x));
  }
  Conv1dDims d;
  d.batch = x.shape[0];
  d.seq_len = x.shape[1];
  d.dim = x.shape[2];
  d.device_type = x.device_type;
  CAKE_CHECK(d.device_type == cakeCPU || d.device_type == cakeCUDA, cakeInvalidArgument,
             "x must be on the CPU or a CUDA device, got ", device_string(x));
  check_float("x", x);
  check_present("weight", weight);
  CAKE_CHECK(weight.ndim == 2 && weight.shape[0] == d.dim && weight.shape[1] >= 1,
             cakeInvalidArgument, "weight must have shape [D, W] with D = ", d.dim,
             " (x.shape[2]) and a width W >= 1, got ", shape_string(weight));
  d.width = weight.shape[1];
  check_float("weight", weight);
  if (present(bias)) {
    check_float("bias", bias);
    check_shape("bias", bias, {d.dim}, "[D]");
  }
  d.num_seqs = present(cu_seqlens) ? check_cu_seqlens(cu_seqlens, d.batch) : d.batch;
  if (present(initial_state)) {
    check_float("initial_state", initial_state);
    check_shape("initial_state", initial_state, {d.num_seqs, d.dim, d.width}, "[N, D, W]");
  }
  for (auto [name, t] : {std::pair<char const*, cakeTensor_t const*>{"weight", &weight},
                         {"bias", &bias},
                         {"initial_state", &initial_state},
                         {"cu_seqlens", &cu_seqlens}}) {
    if (present(*t)) check_same_device(name, *t, "x", x);
  }
  if (present(cu_seqlens) && d.device_type == cakeCPU) {
    check_cu_seqlens_contents(cu_seqlens, d.seq_len);
  }
  return d;
}

}  // namespace

Conv1dDims validate_conv1d_forward(cakeConv1dForwardArgs_t const* args) {
  CAKE_CHECK(args != nullptr, cakeInvalidArgument, "args must not be NULL");
  check_header(args->struct_size, sizeof(cakeConv1dForwardArgs_t), "cakeConv1dForwardArgs_t",
               args->activation);
  Conv1dDims const d =
      check_inputs(args->x, args->weight, args->bias, args->initial_state, args->cu_seqlens);
  std::vector<int64_t> const tokens = {d.batch, d.seq_len, d.dim};
  if (present(args->residual)) {
    check_float("residual", args->residual);
    check_shape("residual", args->residual, tokens, "[B, T, D] (as x)");
    check_same_device("residual", args->residual, "x", args->x);
  }
  check_present("y", args->y);
  check_output("y", args->y, tokens, "[B, T, D] (as x)", "x", args->x);
  if (present(args->final_state)) {
    check_output("final_state", args->final_state, {d.num_seqs, d.dim, d.width}, "[N, D, W]", "x",
                 args->x);
  }
  return d;
}

Conv1dDims validate_conv1d_backward(cakeConv1dBackwardArgs_t const* args) {
  CAKE_CHECK(args != nullptr, cakeInvalidArgument, "args must not be NULL");
  check_header(args->struct_size, sizeof(cakeConv1dBackwardArgs_t), "cakeConv1dBackwardArgs_t",
               args->activation);
  Conv1dDims const d =
      check_inputs(args->x, args->weight, args->bias, args->initial_state, args->cu_seqlens);
  std::vector<int64_t> const tokens = {d.batch, d.seq_len, d.dim};
  std::vector<int64_t> const state = {d.num_seqs, d.dim, d.width};
  cakeTensor_t const& x = args->x;
  check_present("dy", args->dy);
  check_output("dy", args->dy, tokens, "[B, T, D] (as y)", "x", x);
  if (present(args->dht)) check_output("dht", args->dht, state, "[N, D, W]", "x", x);
  check_optional_output("dx", args->dx, true, "", tokens, "[B, T, D] (as x)", "x", x);
  check_optional_output("dweight", args->dweight, true, "", {d.dim, d.width}, "[D, W] (as weight)",
                        "x", x);
  check_optional_output("dbias", args->dbias, present(args->bias), "a bias", {d.dim},
                        "[D] (as bias)", "x", x);
  check_optional_output("dresidual", args->dresidual, true, "", tokens, "[B, T, D] (as x)", "x", x);
  check_optional_output("dinitial_state", args->dinitial_state, present(args->initial_state),
                        "an initial_state", state, "[N, D, W] (as initial_state)", "x", x);
  return d;
}

void check_conv1d_forward_apart(cakeConv1dForwardArgs_t const& args) {
  check_no_overlap({{"y", &args.y}, {"final_state", &args.final_state}},
                   {{"x", &args.x},
                    {"weight", &args.weight},
                    {"bias", &args.bias},
                    {"residual", &args.residual},
                    {"initial_state", &args.initial_state},
                    {"cu_seqlens", &args.cu_seqlens}});
}

void check_conv1d_backward_apart(cakeConv1dBackwardArgs_t const& args) {
  check_no_overlap({{"dx", &args.dx},
                    {"dweight", &args.dweight},
                    {"dbias", &args.dbias},
                    {"dresidual", &args.dresidual},
                    {"dinitial_state", &args.dinitial_state}},
                   {{"x", &args.x},
                    {"weight", &args.weight},
                    {"bias", &args.bias},
                    {"initial_state", &args.initial_state},
                    {"cu_seqlens", &args.cu_seqlens},
                    {"dy", &args.dy},
                    {"dht", &args.dht}});
}

}  // namespace cake::ops
