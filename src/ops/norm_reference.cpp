#include "ops/norm_reference.hpp"

#include <vector>

#include "core/tensor.hpp"
#include "ref/norm.hpp"

namespace cake::ops {

namespace {

// The FP64 arrays of one call's inputs (absent optional ones empty).
struct Arrays {
  std::vector<double> x, g, weight;

  ref::NormInputs inputs(double eps, int32_t activation) const {
    auto opt = [](std::vector<double> const& v) { return v.empty() ? nullptr : v.data(); };
    return {x.data(), opt(g), opt(weight), eps,
            activation == cakeActivationSigmoid ? ref::GateActivation::kSigmoid
                                                : ref::GateActivation::kSilu};
  }
};

std::vector<double> optional(cakeTensor_t const& t) {
  return present(t) ? to_double(t) : std::vector<double>{};
}

Arrays arrays(cakeTensor_t const& x, cakeTensor_t const& g, cakeTensor_t const& weight) {
  return {to_double(x), optional(g), optional(weight)};
}

}  // namespace

void norm_reference_forward(cakeRmsNormForwardArgs_t const& args, NormDims const& d) {
  Arrays const a = arrays(args.x, args.g, args.weight);
  std::vector<double> y(a.x.size()), rstd(d.rows);
  ref::rms_norm_forward({d.rows, d.dim}, a.inputs(args.eps, args.activation), y.data(),
                        rstd.data());
  from_double(y, args.y);
  from_double(rstd, args.rstd);
}

void norm_reference_backward(cakeRmsNormBackwardArgs_t const& args, NormDims const& d) {
  Arrays const a = arrays(args.x, args.g, args.weight);
  std::vector<double> const rstd = to_double(args.rstd), dy = to_double(args.dy);
  auto sized = [](cakeTensor_t const& t) { return std::vector<double>(present(t) ? numel(t) : 0); };
  std::vector<double> dx = sized(args.dx), dg = sized(args.dg), dweight = sized(args.dweight);
  auto out = [](std::vector<double>& v) { return v.empty() ? nullptr : v.data(); };
  ref::rms_norm_backward({d.rows, d.dim}, a.inputs(0.0, args.activation), rstd.data(), dy.data(),
                         {out(dx), out(dg), out(dweight)});
  for (auto [values, t] : {std::pair{&dx, &args.dx}, {&dg, &args.dg}, {&dweight, &args.dweight}}) {
    if (present(*t)) from_double(*values, *t);
  }
}

}  // namespace cake::ops
