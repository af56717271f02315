// The in-op activation kernels' own source (src/kernels/gate) on the CPU emulator against the
// FP64 formulas of src/ref/preprocess.cpp on the inputs as the kernels read them: g from the raw
// gate in both forms, beta's sigmoid, and the backward's dg_raw, dbeta_raw, dt_bias's sums per
// slot and A_log's per value head. The raw inputs in bfloat16, float16 and float32 (outputs in
// those dtypes), widths 1 (GDN) and 128 (KDA), token counts across tile edges (64 tokens a tile
// for rows of at most 64 slots, else 256), rows of 64 and 65 slots, more tiles than a block's
// warps take in one round of the reduction (32 x 4), rows of more than one group of 32 slots,
// and none; and the optional pointers absent: no A_log (bounded form) or dt_bias, no dg_raw (the
// sums alone), no partials (dg_raw alone). Outputs poisoned first; two runs bitwise equal.
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

// Values in a runtime dtype (bfloat16, float16 or float32), with the doubles they round to.
struct Stored {
  cakeDtype_t dtype;
  std::vector<bf16> b;
  std::vector<__half> h;
  std::vector<float> f;
  void* data() {
    if (dtype == cakeBfloat16) return b.data();
    return dtype == cakeFloat16 ? static_cast<void*>(h.data()) : f.data();
  }
  double at(size_t i) const {
    if (dtype == cakeBfloat16) return __bfloat162float(b[i]);
    return dtype == cakeFloat16 ? __half2float(h[i]) : f[i];
  }
  size_t size() const {
    if (dtype == cakeBfloat16) return b.size();
    return dtype == cakeFloat16 ? h.size() : f.size();
  }
  // Bitwise equal (NaN poison included, which == on the values would not be).
  bool same_bytes(Stored const& o) const {
    size_t const bytes = size() * (dtype == cakeFloat32 ? 4 : 2);
    void const* x = const_cast<Stored*>(this)->data();
    void const* y = const_cast<Stored&>(o).data();
    return dtype == o.dtype && size() == o.size() && std::memcmp(x, y, bytes) == 0;
  }
  std::vector<double> values() const {
    std::vector<double> x(size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = at(i);
    return x;
  }
};

Stored stored(cakeDtype_t dtype, std::vector<double> const& x) {
  Stored s{dtype, {}, {}, {}};
  for (double v : x) {
    if (dtype == cakeBfloat16)
      s.b.push_back(__float2bfloat16(static_cast<float>(v)));
    else if (dtype == cakeFloat16)
      s.h.push_back(__float2half(static_cast<float>(v)));
    else
      s.f.push_back(static_cast<float>(v));
  }
  return s;
}

// Poisoned storage of n elements of dtype.
Stored poisoned_stored(cakeDtype_t dtype, size_t n) {
  Stored s{dtype, {}, {}, {}};
  if (dtype == cakeBfloat16)
    s.b = poisoned<bf16>(n);
  else if (dtype == cakeFloat16)
    s.h = poisoned<__half>(n);
  else
    s.f = poisoned<float>(n);
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

// What a call leaves out: the optional inputs (A_log in the bounded form only), and the outputs
// the op may not want (dg_raw when only the sums are asked for; the sums, and with them the
// partials, when only dg_raw is).
struct Absent {
  bool A_log = false, dt_bias = false, dg_raw = false, sums = false;
};

// One forward and one backward of the kernels.
Outputs run(gate::Params p, Stored& g_raw, Stored& beta_raw, Stored& A_log, Stored& dt_bias,
            std::vector<float> const& dg, std::vector<float> const& dbeta, Absent absent) {
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
  p.A_log = absent.A_log ? nullptr : A_log.data();
  p.A_log_dtype = A_log.dtype;
  p.dt_bias = absent.dt_bias ? nullptr : dt_bias.data();
  p.dt_bias_dtype = dt_bias.dtype;
  p.g = out.g.data();
  p.beta = out.beta.data();
  EXPECT_EQ(gate::launch_forward(p, nullptr), cudaSuccess);
  p.dg = dg.data();
  p.dbeta = dbeta.data();
  p.dg_raw = absent.dg_raw ? nullptr : out.dg_raw.data();
  p.dbeta_raw = out.dbeta_raw.data();
  p.dA_log = absent.sums || absent.A_log ? nullptr : out.dA_log.data();
  p.ddt_bias = absent.sums || absent.dt_bias ? nullptr : out.ddt_bias.data();
  p.partials = absent.sums ? nullptr : partials.data();
  EXPECT_EQ(gate::launch_backward(p, nullptr), cudaSuccess);
  return out;
}

// Errors within `tol` relative (rel-RMS and max over max|ref|), all finite.
void expect_close(char const* name, Errors const& e, double tol) {
  EXPECT_TRUE(e.finite && e.rel_rms() <= tol && e.max_rel() <= tol)
      << name << ": rel-RMS " << e.rel_rms() << ", max " << e.max_rel();
}

// bt tokens, hv value heads, width W; dtype of every raw input and its gradient; lower_bound < 0:
// the bounded form. Outputs left out stay as poisoned.
void check(int64_t bt, int hv, int width, cakeDtype_t dtype, double lower_bound,
           Absent absent = {}) {
  unsigned const seed = std::random_device{}();
  std::mt19937 rng(seed);
  SCOPED_TRACE(testing::Message() << "seed " << seed << ", BT " << bt << ", HV " << hv << ", W "
                                  << width << ", lower_bound " << lower_bound << ", absent "
                                  << absent.A_log << absent.dt_bias << absent.dg_raw
                                  << absent.sums);
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
  Outputs const a = run(p, g_raw, beta_raw, A_log, dt_bias, dg32, dbeta32, absent);
  Outputs const b = run(p, g_raw, beta_raw, A_log, dt_bias, dg32, dbeta32, absent);
  EXPECT_TRUE(a.g == b.g && a.beta == b.beta && a.dg_raw.same_bytes(b.dg_raw) &&
              a.dbeta_raw.same_bytes(b.dbeta_raw) && a.dA_log.same_bytes(b.dA_log) &&
              a.ddt_bias.same_bytes(b.ddt_bias))
      << "two runs differ";

  cake::ref::GateParams gp;
  gp.num_v_heads = hv;
  gp.width = width;
  if (!absent.A_log) gp.A_log = A_log.values();
  if (!absent.dt_bias) gp.dt_bias = dt_bias.values();
  if (lower_bound < 0) gp.lower_bound = lower_bound;
  std::vector<double> const g = cake::ref::gate_forward(gp, g_raw.values());
  std::vector<double> const beta = cake::ref::beta_sigmoid_forward(beta_raw.values(), 2.0);
  cake::ref::GateGrads const gg = cake::ref::gate_backward(gp, g_raw.values(), dg);
  std::vector<double> const dbeta_raw =
      cake::ref::beta_sigmoid_backward(beta_raw.values(), 2.0, dbeta);
  // fp32 arithmetic (1e-5); outputs in bf16 or fp16 (their rounding, 2^-8 or 2^-11 relative of
  // each element); the sums over up to bt fp32 terms
  double const rounding = dtype == cakeBfloat16 ? 8e-3 : dtype == cakeFloat16 ? 1e-3 : 1e-4;
  expect_close("g", errors(a.g, g), 1e-5);
  expect_close("beta", errors(a.beta, beta), 1e-5);
  if (bt > 0) {
    expect_close("dbeta_raw", errors(a.dbeta_raw.values(), dbeta_raw), rounding);
    if (!absent.dg_raw) expect_close("dg_raw", errors(a.dg_raw.values(), gg.dg_raw), rounding);
  }
  if (!absent.sums && !absent.A_log)
    expect_close("dA_log", errors(a.dA_log.values(), gg.dA_log), rounding);
  if (!absent.sums && !absent.dt_bias)
    expect_close("ddt_bias", errors(a.ddt_bias.values(), gg.ddt_bias), rounding);
  // what was left out was not written
  auto untouched = [](Stored const& x) {
    return x.same_bytes(poisoned_stored(x.dtype, x.size()));
  };
  if (absent.dg_raw) EXPECT_TRUE(untouched(a.dg_raw)) << "dg_raw written";
  if (absent.sums || absent.A_log) EXPECT_TRUE(untouched(a.dA_log)) << "dA_log written";
  if (absent.sums || absent.dt_bias) EXPECT_TRUE(untouched(a.ddt_bias)) << "ddt_bias written";
}

TEST(EmulatedGate, SoftplusFormMatchesFp64) {
  for (int64_t bt : {1, 255, 257, 600, 9000}) check(bt, 3, 1, cakeBfloat16, 0);
  check(200, 64, 1, cakeBfloat16, 0);    // the longest row of 64-token tiles
  check(33000, 65, 1, cakeBfloat16, 0);  // 256-token tiles: 129, past one round of 128
  check(300, 2, 128, cakeFloat16, 0);
  check(2309, 40, 1, cakeBfloat16, 0);
}

TEST(EmulatedGate, LowerBoundFormMatchesFp64) {
  check(513, 2, 128, cakeBfloat16, -5);
  check(70, 4, 1, cakeFloat16, -5);
  check(2309, 40, 1, cakeFloat16, -5);
}

TEST(EmulatedGate, Float32RawInputsMatchFp64) {
  check(600, 3, 1, cakeFloat32, 0);
  check(300, 2, 128, cakeFloat32, -5);
}

TEST(EmulatedGate, AbsentInputsAndOutputs) {
  check(600, 3, 1, cakeBfloat16, -5, {.A_log = true});
  check(300, 2, 128, cakeBfloat16, 0, {.dt_bias = true});
  check(2309, 40, 1, cakeBfloat16, 0, {.dg_raw = true});
  check(600, 2, 128, cakeFloat16, 0, {.sums = true});
}

// No tokens: no element to write, and the sums are zero.
TEST(EmulatedGate, NoTokensGiveZeroSums) { check(0, 3, 128, cakeBfloat16, 0); }

}  // namespace
