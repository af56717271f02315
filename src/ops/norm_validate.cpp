#include "ops/norm_validate.hpp"

#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "core/tensor.hpp"
#include "ops/checks.hpp"

namespace cake::ops {

namespace {

void check_header(size_t struct_size, size_t expected, char const* type, int32_t activation,
                  bool gated) {
  CAKE_CHECK(struct_size == expected, cakeInvalidArgument, "args.struct_size must be sizeof(", type,
             ") = ", expected, ", got ", struct_size);
  bool const gate = activation == cakeActivationSilu || activation == cakeActivationSigmoid;
  CAKE_CHECK(gate || (!gated && activation == cakeActivationNone), cakeInvalidArgument,
             "activation must be cakeActivationSilu (1) or cakeActivationSigmoid (2)",
             gated ? " with g" : " (or cakeActivationNone (0) without g)", ", got ", activation);
}

std::vector<int64_t> shape_of(cakeTensor_t const& t) {
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

// The inputs shared by the forward and the backward.
NormDims check_inputs(cakeTensor_t const& x, cakeTensor_t const& g, cakeTensor_t const& weight) {
  check_present("x", x);
  CAKE_CHECK(x.ndim >= 1 && x.ndim <= CAKE_MAX_DIMS, cakeInvalidArgument, "x must have 1 to ",
             CAKE_MAX_DIMS, " dimensions [..., N], got ", x.ndim);
  NormDims d;
  d.rows = 1;
  for (int dim = 0; dim < x.ndim; ++dim) {
    CAKE_CHECK(x.shape[dim] >= 0, cakeInvalidArgument, "x must have non-negative sizes, got shape ",
               shape_string(x));
    if (dim + 1 < x.ndim) d.rows *= x.shape[dim];
  }
  d.dim = x.shape[x.ndim - 1];
  CAKE_CHECK(d.dim >= 1, cakeInvalidArgument,
             "x must have a last dimension N >= 1 (the values normalised together), got shape ",
             shape_string(x));
  d.device_type = x.device_type;
  CAKE_CHECK(d.device_type == cakeCPU || d.device_type == cakeCUDA, cakeInvalidArgument,
             "x must be on the CPU or a CUDA device, got ", device_string(x));
  check_float("x", x);
  if (present(g)) {
    check_float("g", g);
    check_shape("g", g, shape_of(x), "x's");
    check_same_device("g", g, "x", x);
  }
  if (present(weight)) {
    check_float("weight", weight);
    check_shape("weight", weight, {d.dim}, "[N]");
    check_same_device("weight", weight, "x", x);
  }
  return d;
}

}  // namespace

NormDims validate_norm_forward(cakeRmsNormForwardArgs_t const* args) {
  CAKE_CHECK(args != nullptr, cakeInvalidArgument, "args must not be NULL");
  check_header(args->struct_size, sizeof(cakeRmsNormForwardArgs_t), "cakeRmsNormForwardArgs_t",
               args->activation, present(args->g));
  NormDims const d = check_inputs(args->x, args->g, args->weight);
  CAKE_CHECK(std::isfinite(args->eps) && args->eps >= 0, cakeInvalidArgument,
             "eps must be finite and >= 0, got ", args->eps);
  check_present("y", args->y);
  check_output("y", args->y, shape_of(args->x), "x's", "x", args->x);
  check_present("rstd", args->rstd);
  check_output("rstd", args->rstd, {d.rows}, "[rows]", "x", args->x);
  return d;
}

NormDims validate_norm_backward(cakeRmsNormBackwardArgs_t const* args) {
  CAKE_CHECK(args != nullptr, cakeInvalidArgument, "args must not be NULL");
  check_header(args->struct_size, sizeof(cakeRmsNormBackwardArgs_t), "cakeRmsNormBackwardArgs_t",
               args->activation, present(args->g));
  cakeTensor_t const& x = args->x;
  NormDims const d = check_inputs(x, args->g, args->weight);
  std::vector<int64_t> const rows = shape_of(x);
  check_present("rstd", args->rstd);
  check_float("rstd", args->rstd);
  check_shape("rstd", args->rstd, {d.rows}, "[rows]");
  check_same_device("rstd", args->rstd, "x", x);
  check_present("dy", args->dy);
  check_output("dy", args->dy, rows, "x's", "x", x);
  check_optional_output("dx", args->dx, true, "", rows, "x's", "x", x);
  check_optional_output("dg", args->dg, present(args->g), "a gate g", rows, "x's", "x", x);
  check_optional_output("dweight", args->dweight, present(args->weight), "a weight", {d.dim},
                        "[N] (as weight)", "x", x);
  return d;
}

void check_norm_forward_apart(cakeRmsNormForwardArgs_t const& args) {
  check_no_overlap({{"y", &args.y}, {"rstd", &args.rstd}},
                   {{"x", &args.x}, {"g", &args.g}, {"weight", &args.weight}});
}

void check_norm_backward_apart(cakeRmsNormBackwardArgs_t const& args) {
  check_no_overlap({{"dx", &args.dx}, {"dg", &args.dg}, {"dweight", &args.dweight}},
                   {{"x", &args.x},
                    {"g", &args.g},
                    {"weight", &args.weight},
                    {"rstd", &args.rstd},
                    {"dy", &args.dy}});
}

}  // namespace cake::ops
