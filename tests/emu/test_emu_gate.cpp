// The in-op activation kernels' own source (src/kernels/gate) on the CPU emulator against the
// FP64 formulas of src/ref/preprocess.cpp on the inputs as the kernels read them: g from the raw
// gate in both forms, beta's sigmoid, and the backward's dg_raw, dbeta_raw, dt_bias's sums per
// slot and A_log's per value head. The raw inputs in bfloat16 and float16 (outputs in those
// dtypes), widths 1 (GDN) and 128 (KDA), token counts across tile edges (256 tokens a tile),
// more tiles than a block's warps take in one round of the reduction (8 x 4), rows of more than
// one group of 32 slots, and none. Outputs poisoned first; two runs bitwise equal.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "emu/gdn_emu_testing.hpp"
#include "kernels/gate/launch.hpp"
#include "ref/preprocess.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::Errors;
using cake::emu_testing::errors;
using cake::emu_testing::poisoned;
namespace gate = cake::kernels::gate;

// Values in a runtime dtype (bfloat16 or float16), with the doubles they round to.
struct Stored {
  cakeDtype_t dtype;
  std::vector<bf16> b;
  std::vector<__half> h;
  void* data() { return dtype == cakeBfloat16 ? static_cast<void*>(b.data()) : h.data(); }
  double at(size_t i) const {
    return dtype == cakeBfloat16 ? __bfloat162float(b[i]) : __half2float(h[i]);
  }
  size_t size() const { return dtype == cakeBfloat16 ? b.size() : h.size(); }
  std::vector<double> values() const {
    std::vector<double> x(size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = at(i);
    return x;
  }
};

Stored stored(cakeDtype_t dtype, std::vector<double> const& x) {
  Stored s{dtype, {}, {}};
  for (double v : x) {
    if (dtype == cakeBfloat16)
      s.b.push_back(__float2bfloat16(static_cast<float>(v)));
    else
      s.h.push_back(__float2half(static_cast<float>(v)));
  }
  return s;
}

// Poisoned storage of n elements of dtype.
Stored poisoned_stored(cakeDtype_t dtype, size_t n) {
  Stored s{dtype, {}, {}};
  if (dtype == cakeBfloat16)
    s.b = poisoned<bf16>(n);
  else
    s.h = poisoned<__half>(n);
  return s;
}

std::vector<double> draw(size_t n, double sd, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, sd);
  std::vector<double> x(n);
  for (double& v : x) v = normal(rng);
  return x;
}

struct Outputs {
  std::vector<float> g, beta;
  Stored dg_raw, dbeta_raw, dA_log, ddt_bias;
};

// One forward and one backward of the kernels.
Outputs run(gate::Params p, Stored& g_raw, Stored& beta_raw, Stored& A_log, Stored& dt_bias,
            std::vector<float> const& dg, std::vector<float> const& dbeta) {
  int64_t const slots = int64_t{p.num_v_heads} * p.width;
  Outputs out{poisoned<float>(p.num_tokens * slots),
              poisoned<float>(p.num_tokens * p.num_v_heads),
              poisoned_stored(g_raw.dtype, p.num_tokens * slots),
              poisoned_stored(beta_raw.dtype, p.num_tokens * p.num_v_heads),
              poisoned_stored(A_log.dtype, p.num_v_heads),
              poisoned_stored(dt_bias.dtype, slots)};
  std::vector<float> partials = poisoned<float>(gate::partials_elements(p.num_tokens, slots));
  p.activate_g = p.activate_beta = true;
  p.g_raw = g_raw.data();
  p.g_dtype = g_raw.dtype;
  p.beta_raw = beta_raw.data();
  p.beta_dtype = beta_raw.dtype;
  p.A_log = A_log.data();
  p.A_log_dtype = A_log.dtype;
  p.dt_bias = dt_bias.data();
  p.dt_bias_dtype = dt_bias.dtype;
  p.g = out.g.data();
  p.beta = out.beta.data();
  EXPECT_EQ(gate::launch_forward(p, nullptr), cudaSuccess);
  p.dg = dg.data();
  p.dbeta = dbeta.data();
  p.dg_raw = out.dg_raw.data();
  p.dbeta_raw = out.dbeta_raw.data();
  p.dA_log = out.dA_log.data();
  p.ddt_bias = out.ddt_bias.data();
  p.partials = partials.data();
  EXPECT_EQ(gate::launch_backward(p, nullptr), cudaSuccess);
  return out;
}

// Errors within `tol` relative (rel-RMS and max over max|ref|), all finite.
void expect_close(char const* name, Errors const& e, double tol) {
  EXPECT_TRUE(e.finite && e.rel_rms() <= tol && e.max_rel() <= tol)
      << name << ": rel-RMS " << e.rel_rms() << ", max " << e.max_rel();
}

// bt tokens, hv value heads, width W; dtype of every raw input and its gradient; lower_bound < 0:
// the bounded form.
void check(int64_t bt, int hv, int width, cakeDtype_t dtype, double lower_bound) {
  unsigned const seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed << ", BT " << bt << ", HV " << hv << ", W "
                                  << width << ", lower_bound " << lower_bound);
  int64_t const slots = int64_t{hv} * width;
  Stored g_raw = stored(dtype, draw(bt * slots, 1.5, rng));
  Stored beta_raw = stored(dtype, draw(bt * hv, 1.5, rng));
  Stored A_log = stored(dtype, draw(hv, 0.5, rng));
  Stored dt_bias = stored(dtype, draw(slots, 0.5, rng));
  std::vector<double> dg = draw(bt * slots, 1.0, rng), dbeta = draw(bt * hv, 1.0, rng);
  std::vector<float> const dg32(dg.begin(), dg.end()), dbeta32(dbeta.begin(), dbeta.end());
  gate::Params p;
  p.num_tokens = bt;
  p.num_v_heads = hv;
  p.width = width;
  p.has_lower_bound = lower_bound < 0;
  p.lower_bound = static_cast<float>(lower_bound);
  p.beta_c = 2.f;
  Outputs const a = run(p, g_raw, beta_raw, A_log, dt_bias, dg32, dbeta32);
  Outputs const b = run(p, g_raw, beta_raw, A_log, dt_bias, dg32, dbeta32);
  EXPECT_TRUE(a.g == b.g && a.beta == b.beta && a.dg_raw.values() == b.dg_raw.values() &&
              a.dbeta_raw.values() == b.dbeta_raw.values() &&
              a.dA_log.values() == b.dA_log.values() && a.ddt_bias.values() == b.ddt_bias.values())
      << "two runs differ";

  cake::ref::GateParams gp;
  gp.num_v_heads = hv;
  gp.width = width;
  gp.A_log = A_log.values();
  gp.dt_bias = dt_bias.values();
  if (lower_bound < 0) gp.lower_bound = lower_bound;
  std::vector<double> const g = cake::ref::gate_forward(gp, g_raw.values());
  std::vector<double> const beta = cake::ref::beta_sigmoid_forward(beta_raw.values(), 2.0);
  cake::ref::GateGrads const gg = cake::ref::gate_backward(gp, g_raw.values(), dg);
  std::vector<double> const dbeta_raw =
      cake::ref::beta_sigmoid_backward(beta_raw.values(), 2.0, dbeta);
  // fp32 arithmetic (1e-5); outputs in bf16 or fp16 (their rounding, 2^-8 or 2^-11 relative of
  // each element); the sums over up to bt fp32 terms
  double const rounding = dtype == cakeBfloat16 ? 8e-3 : 1e-3;
  expect_close("g", errors(a.g, g), 1e-5);
  expect_close("beta", errors(a.beta, beta), 1e-5);
  if (bt > 0) {
    expect_close("dg_raw", errors(a.dg_raw.values(), gg.dg_raw), rounding);
    expect_close("dbeta_raw", errors(a.dbeta_raw.values(), dbeta_raw), rounding);
  }
  expect_close("dA_log", errors(a.dA_log.values(), gg.dA_log), rounding);
  expect_close("ddt_bias", errors(a.ddt_bias.values(), gg.ddt_bias), rounding);
}

TEST(EmulatedGate, SoftplusFormMatchesFp64) {
  for (int64_t bt : {1, 255, 257, 600, 9000}) check(bt, 3, 1, cakeBfloat16, 0);
  check(300, 2, 128, cakeFloat16, 0);
  check(2309, 40, 1, cakeBfloat16, 0);
}

TEST(EmulatedGate, LowerBoundFormMatchesFp64) {
  check(513, 2, 128, cakeBfloat16, -5);
  check(70, 4, 1, cakeFloat16, -5);
  check(2309, 40, 1, cakeFloat16, -5);
}

// No tokens: no element to write, and the sums are zero.
TEST(EmulatedGate, NoTokensGiveZeroSums) { check(0, 3, 128, cakeBfloat16, 0); }

}  // namespace
