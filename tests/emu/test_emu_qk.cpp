// The q/k L2-norm kernels' own source on the CPU emulator (emu/runtime.hpp) against double
// arithmetic: qk_norm (y = x / sqrt(sum x^2 + 1e-6), bf16 out, and rstd = 1 / sqrt(sum x^2 + 1e-6))
// and qk_grad (dq, dk summed over each q/k head's value heads, then the norm's backward
// dx = rstd (dy - <dy, y> y) from qk_norm's y and rstd, bf16 out, against the exact gradient), on
// row counts that leave the last block's warps partly or wholly idle (8 rows a block). Outputs
// poisoned first. The launches run on the emulator (launch_emu.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "emu/gdn_emu_testing.hpp"
#include "kernels/qk_grad/launch.hpp"
#include "kernels/qk_norm/launch.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::Errors;
using cake::emu_testing::poisoned;
using cake::emu_testing::K;
namespace kn = cake::kernels;

std::vector<bf16> random_bf16(size_t n, std::mt19937& rng, std::vector<double>& as_double) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<bf16> x(n);
  as_double.resize(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = __float2bfloat16(static_cast<float>(normal(rng)));
    as_double[i] = __bfloat162float(x[i]);
  }
  return x;
}

TEST(EmulatedQk, NormMatchesDouble) {
  std::mt19937 rng(std::random_device{}());
  int64_t const rows = 37;  // 8 rows a block: the last block has 3 warps with a row
  std::vector<double> q, k;
  std::vector<bf16> const q16 = random_bf16(rows * K, rng, q), k16 = random_bf16(rows * K, rng, k);
  std::vector<bf16> q_norm = poisoned<bf16>(rows * K), k_norm = poisoned<bf16>(rows * K);
  std::vector<float> q_rstd = poisoned<float>(rows), k_rstd = poisoned<float>(rows);
  kn::qk_norm::Params p;
  p.num_rows = rows;
  p.q = q16.data();
  p.k = k16.data();
  p.q_norm = q_norm.data();
  p.k_norm = k_norm.data();
  p.q_rstd = q_rstd.data();
  p.k_rstd = k_rstd.data();
  EXPECT_EQ(kn::qk_norm::launch(p, nullptr), cudaSuccess);
  for (auto [x, y, rstd] : {std::tuple{&q, &q_norm, &q_rstd}, std::tuple{&k, &k_norm, &k_rstd}}) {
    std::vector<double> ref(rows * K), ref_rstd(rows);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < K; ++i) ss += (*x)[r * K + i] * (*x)[r * K + i];
      ref_rstd[r] = 1.0 / std::sqrt(ss + 1e-6);
      for (int i = 0; i < K; ++i) ref[r * K + i] = (*x)[r * K + i] * ref_rstd[r];
    }
    Errors e;
    e.add(cake::emu_testing::widen(*y), ref);
    EXPECT_TRUE(e.finite);
    EXPECT_LT(e.max_rel(), 1.0 / 128) << "bf16 rounding of a unit row's largest element";
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_NEAR((*rstd)[r], ref_rstd[r], 1e-5 * ref_rstd[r]) << "row " << r;
  }
}

// What qk_norm hands qk_grad for rows of x: y = bf16(x rstd) and rstd (fp32), from double.
void normalised(std::vector<double> const& x, int64_t rows, std::vector<bf16>& y,
                std::vector<float>& rstd) {
  y.resize(rows * K);
  rstd.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < K; ++i) ss += x[r * K + i] * x[r * K + i];
    rstd[r] = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
    for (int i = 0; i < K; ++i)
      y[r * K + i] = __float2bfloat16(static_cast<float>(x[r * K + i] * rstd[r]));
  }
}

// dq_hv, dk_hv [BT, HV, K] fp32 -> dq, dk [BT, H, K] bf16, with and without the norm's backward.
void check_grad(bool use_l2norm, std::mt19937& rng) {
  int64_t const tokens = 5;
  int const H = 3, group = 3, HV = H * group;
  int64_t const rows = tokens * H;  // 15 rows: the second block has 7 warps with a row
  std::vector<double> q, k;
  random_bf16(rows * K, rng, q);
  random_bf16(rows * K, rng, k);
  std::vector<bf16> q_norm, k_norm;
  std::vector<float> q_rstd, k_rstd;
  normalised(q, rows, q_norm, q_rstd);
  normalised(k, rows, k_norm, k_rstd);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> dq_hv(tokens * HV * K), dk_hv(tokens * HV * K);
  for (auto& x : dq_hv) x = static_cast<float>(normal(rng));
  for (auto& x : dk_hv) x = static_cast<float>(normal(rng));
  std::vector<bf16> dq = poisoned<bf16>(rows * K), dk = poisoned<bf16>(rows * K);
  kn::qk_grad::Params p;
  p.num_tokens = tokens;
  p.num_qk_heads = H;
  p.group_size = group;
  p.use_l2norm = use_l2norm;
  if (use_l2norm) {  // without the norm qk_grad reads none of them
    p.q_norm = q_norm.data();
    p.k_norm = k_norm.data();
    p.q_rstd = q_rstd.data();
    p.k_rstd = k_rstd.data();
  }
  p.dq_hv = dq_hv.data();
  p.dk_hv = dk_hv.data();
  p.dq = dq.data();
  p.dk = dk.data();
  EXPECT_EQ(kn::qk_grad::launch(p, nullptr), cudaSuccess);
  for (auto [x, x_hv, dx] : {std::tuple{&q, &dq_hv, &dq}, std::tuple{&k, &dk_hv, &dk}}) {
    std::vector<double> ref(rows * K);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> dy(K, 0.0);
      for (int gi = 0; gi < group; ++gi)
        for (int i = 0; i < K; ++i) dy[i] += (*x_hv)[(r * group + gi) * K + i];
      if (!use_l2norm) {
        for (int i = 0; i < K; ++i) ref[r * K + i] = dy[i];
        continue;
      }
      double ss = 0, dot = 0;
      for (int i = 0; i < K; ++i) ss += (*x)[r * K + i] * (*x)[r * K + i];
      double const rstd = 1.0 / std::sqrt(ss + 1e-6);
      for (int i = 0; i < K; ++i) dot += dy[i] * (*x)[r * K + i] * rstd;
      for (int i = 0; i < K; ++i) ref[r * K + i] = rstd * (dy[i] - dot * (*x)[r * K + i] * rstd);
    }
    Errors e;
    e.add(cake::emu_testing::widen(*dx), ref);
    EXPECT_TRUE(e.pass()) << "l2norm " << use_l2norm << ": rel RMS " << e.rel_rms() << ", max "
                          << e.max_rel();
  }
}

TEST(EmulatedQk, GradMatchesDouble) {
  std::mt19937 rng(std::random_device{}());
  check_grad(false, rng);
  check_grad(true, rng);
}

}  // namespace
