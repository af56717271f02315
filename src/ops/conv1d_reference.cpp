#include "ops/conv1d_reference.hpp"

#include <vector>

#include "core/tensor.hpp"
#include "ref/conv1d.hpp"

namespace cake::ops {

namespace {

// The FP64 arrays of one call's inputs (absent optional ones empty).
struct Arrays {
  ref::Conv1dShape shape;
  std::vector<double> x, weight, bias, residual, h0;
  ref::Activation activation;

  ref::Conv1dInputs inputs() const {
    auto opt = [](std::vector<double> const& v) { return v.empty() ? nullptr : v.data(); };
    return {x.data(), weight.data(), opt(bias), opt(residual), opt(h0), activation};
  }
};

std::vector<double> optional(cakeTensor_t const& t) {
  return present(t) ? to_double(t) : std::vector<double>{};
}

Arrays arrays(int32_t activation, cakeTensor_t const& x, cakeTensor_t const& weight,
              cakeTensor_t const& bias, cakeTensor_t const& residual,
              cakeTensor_t const& initial_state, cakeTensor_t const& cu_seqlens,
              Conv1dDims const& d) {
  Arrays a;
  a.shape.num_tokens = d.batch * d.seq_len;
  a.shape.dim = d.dim;
  a.shape.width = d.width;
  if (present(cu_seqlens)) {
    a.shape.cu_seqlens = to_int64(cu_seqlens);
  } else {
    // B rows of T tokens are B documents of a [B * T] pack, since the layout is token-major.
    for (int64_t b = 0; b <= d.batch; ++b) a.shape.cu_seqlens.push_back(b * d.seq_len);
  }
  a.x = to_double(x);
  a.weight = to_double(weight);
  a.bias = optional(bias);
  a.residual = optional(residual);
  a.h0 = optional(initial_state);
  a.activation = activation == cakeActivationSilu ? ref::Activation::kSilu : ref::Activation::kNone;
  return a;
}

}  // namespace

void conv1d_reference_forward(cakeConv1dForwardArgs_t const& args, Conv1dDims const& d) {
  Arrays const a = arrays(args.activation, args.x, args.weight, args.bias, args.residual,
                          args.initial_state, args.cu_seqlens, d);
  std::vector<double> y(a.x.size());
  std::vector<double> ht(present(args.final_state) ? numel(args.final_state) : 0);
  ref::conv1d_forward(a.shape, a.inputs(), {y.data(), ht.empty() ? nullptr : ht.data()});
  from_double(y, args.y);
  if (!ht.empty()) from_double(ht, args.final_state);
}

void conv1d_reference_backward(cakeConv1dBackwardArgs_t const& args, Conv1dDims const& d) {
  cakeTensor_t const no_residual{};
  Arrays const a = arrays(args.activation, args.x, args.weight, args.bias, no_residual,
                          args.initial_state, args.cu_seqlens, d);
  std::vector<double> const dy = to_double(args.dy);
  std::vector<double> const dht = optional(args.dht);
  auto sized = [](cakeTensor_t const& t) { return std::vector<double>(present(t) ? numel(t) : 0); };
  std::vector<double> dx = sized(args.dx), dweight = sized(args.dweight), dbias = sized(args.dbias),
                      dresidual = sized(args.dresidual), dh0 = sized(args.dinitial_state);
  auto out = [](std::vector<double>& v) { return v.empty() ? nullptr : v.data(); };
  ref::conv1d_backward(a.shape, a.inputs(), dy.data(), dht.empty() ? nullptr : dht.data(),
                       {out(dx), out(dweight), out(dbias), out(dresidual), out(dh0)});
  for (auto [values, t] : {std::pair{&dx, &args.dx},
                           {&dweight, &args.dweight},
                           {&dbias, &args.dbias},
                           {&dresidual, &args.dresidual},
                           {&dh0, &args.dinitial_state}}) {
    if (present(*t)) from_double(*values, *t);
  }
}

}  // namespace cake::ops
