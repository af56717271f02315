// The norm's GPU op (src/ops/cuda/norm_cuda.cpp and the kernels of norm_fwd, norm_bwd) on the CPU
// emulator, through the C ABI on "CUDA" tensors in host memory, against the FP64 reference
// (ref/norm.hpp) on the same rounded inputs: bfloat16, float16 and float32 rows of N = 64, 128,
// 256 (and 8 and 1024, the extremes of the row layouts; 24, 96, 200 and 1000, whose vector counts
// are no power of two, so that lanes hold vectors past the row's end that they must neither read
// nor write), row counts that leave a block's last rows empty, with and without gate and weight,
// silu and sigmoid, an all-zero row, large values, a pack that makes the blocks walk more than
// one step, and no rows at all. Outputs poisoned first; guard bytes after the exact workspace stay
// untouched.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "emu/gdn_emu_testing.hpp"
#include "kernels/common/norm_rows.hpp"
#include "ref/norm.hpp"

namespace {

using cake::emu_testing::cuda_view;
using cake::emu_testing::Errors;
using cake::emu_testing::from_double;
using cake::emu_testing::poisoned;
using cake::emu_testing::random_values;
using cake::emu_testing::widen;

struct Case {
  int64_t rows, dim;
  bool gated, weighted;
  int32_t activation;     // cakeActivationSilu or cakeActivationSigmoid
  double scale = 1.0;     // of x: 1e3 for large values
  bool zero_row = false;  // row 1 all zeros: rstd = 1 / sqrt(eps)
};

std::string label(Case const& c) {
  return "rows " + std::to_string(c.rows) + ", N " + std::to_string(c.dim) +
         (c.gated ? (c.activation == cakeActivationSilu ? ", silu gate" : ", sigmoid gate") : "") +
         (c.weighted ? ", weight" : "") + (c.scale != 1.0 ? ", large x" : "") +
         (c.zero_row ? ", zero row" : "");
}

// Relative RMS <= 1e-2 and max-abs <= 2e-2 max|ref| (the accuracy gate), 1e-5 for float32.
template <class T, class U>
void expect_gate(char const* name, std::vector<U> const& got, std::vector<double> const& ref,
                 std::string const& what) {
  bool const fp32 = std::is_same_v<T, float>;
  Errors e;
  e.add(widen(got), ref);
  SCOPED_TRACE(std::string(name) + ", " + what);
  EXPECT_TRUE(e.finite);
  EXPECT_LE(e.rel_rms(), fp32 ? 1e-5 : 1e-2);
  EXPECT_LE(e.max_rel(), fp32 ? 1e-5 : 2e-2);
}

// The backward's arguments after the forward `fa`: its activation, x, g, weight and rstd, and
// the given dy and gradients (an empty tensor: a gradient not wanted).
cakeRmsNormBackwardArgs_t backward_args(cakeRmsNormForwardArgs_t const& fa, cakeTensor_t dy,
                                        cakeTensor_t dx, cakeTensor_t dg, cakeTensor_t dweight) {
  cakeRmsNormBackwardArgs_t ba{};
  ba.struct_size = sizeof ba;
  ba.activation = fa.activation;
  ba.x = fa.x;
  ba.g = fa.g;
  ba.weight = fa.weight;
  ba.rstd = fa.rstd;
  ba.dy = dy;
  ba.dx = dx;
  ba.dg = dg;
  ba.dweight = dweight;
  return ba;
}

template <class T>
void check_case(Case const& c, uint64_t seed) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  int64_t const R = c.rows, N = c.dim;
  double const eps = 1e-5;
  std::vector<T> x = random_values<T>(R * N, rng, c.scale);
  if (c.zero_row) std::fill(x.begin() + N, x.begin() + 2 * N, from_double<T>(0.0));
  std::vector<T> const g = random_values<T>(R * N, rng, 2.0),
                       dy = random_values<T>(R * N, rng, 1.0);
  std::vector<float> const weight = random_values<float>(N, rng, 1.0);

  cake::ref::NormShape const shape{R, N};
  std::vector<double> const xd = widen(x), gd = widen(g), wd = widen(weight), dyd = widen(dy);
  cake::ref::NormInputs const in{
      xd.data(), c.gated ? gd.data() : nullptr, c.weighted ? wd.data() : nullptr,
      static_cast<double>(static_cast<float>(eps)),
      c.activation == cakeActivationSilu ? cake::ref::GateActivation::kSilu
                                         : cake::ref::GateActivation::kSigmoid};
  std::vector<double> y_ref(R * N), rstd_ref(R), dx_ref(R * N), dg_ref(R * N), dw_ref(N);
  cake::ref::rms_norm_forward(shape, in, y_ref.data(), rstd_ref.data());
  cake::ref::rms_norm_backward(
      shape, in, rstd_ref.data(), dyd.data(),
      {dx_ref.data(), c.gated ? dg_ref.data() : nullptr, c.weighted ? dw_ref.data() : nullptr});

  // [R, N] as [1, R, N]: leading sizes multiply to the rows.
  std::vector<int64_t> const rows_shape = {1, R, N};
  auto optional = [](bool on, cakeTensor_t t) { return on ? t : cakeTensor_t{}; };
  std::vector<T> y = poisoned<T>(R * N);
  std::vector<float> rstd = poisoned<float>(R);
  cakeRmsNormForwardArgs_t fa{};
  fa.struct_size = sizeof fa;
  fa.activation = c.activation;
  fa.eps = eps;
  fa.x = cuda_view(x.data(), rows_shape);
  fa.g = optional(c.gated, cuda_view(g.data(), rows_shape));
  fa.weight = optional(c.weighted, cuda_view(weight.data(), {N}));
  fa.y = cuda_view(y.data(), rows_shape);
  fa.rstd = cuda_view(rstd.data(), {R});
  ASSERT_EQ(cakeRmsNormForward(&fa, nullptr), cakeSuccess) << cakeGetLastError();

  auto backward = [&](std::vector<T>& dx, std::vector<T>& dg, std::vector<float>& dw) {
    cakeRmsNormBackwardArgs_t ba =
        backward_args(fa, cuda_view(dy.data(), rows_shape), cuda_view(dx.data(), rows_shape),
                      optional(c.gated, cuda_view(dg.data(), rows_shape)),
                      optional(c.weighted, cuda_view(dw.data(), {N})));
    size_t bytes = 0;
    ASSERT_EQ(cakeRmsNormBackwardWorkspaceSize(&ba, &bytes), cakeSuccess) << cakeGetLastError();
    EXPECT_EQ(bytes > 0, c.weighted);
    constexpr size_t kGuard = 1024;
    std::vector<unsigned char> ws(bytes + kGuard + 256, 0xff);
    auto* base = ws.data() + (256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256;
    std::memset(base + bytes, 0xa5, kGuard);
    ASSERT_EQ(cakeRmsNormBackward(&ba, bytes ? base : nullptr, bytes, nullptr), cakeSuccess)
        << cakeGetLastError();
    for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(base[bytes + i], 0xa5) << "guard byte " << i;
  };
  std::vector<T> dx = poisoned<T>(R * N), dg = poisoned<T>(R * N);
  std::vector<float> dw = poisoned<float>(N);
  backward(dx, dg, dw);

  std::string const what = label(c);
  expect_gate<T>("y", y, y_ref, what);
  expect_gate<T>("rstd", rstd, rstd_ref, what);
  expect_gate<T>("dx", dx, dx_ref, what);
  if (c.gated) expect_gate<T>("dg", dg, dg_ref, what);
  if (c.weighted) expect_gate<T>("dweight", dw, dw_ref, what);
  if (c.zero_row) {
    EXPECT_NEAR(rstd[1], 1.0 / std::sqrt(static_cast<double>(static_cast<float>(eps))), 1e-3)
        << what;
  }

  std::vector<T> dx2 = poisoned<T>(R * N), dg2 = poisoned<T>(R * N);
  std::vector<float> dw2 = poisoned<float>(N);
  backward(dx2, dg2, dw2);
  EXPECT_EQ(std::memcmp(dx.data(), dx2.data(), dx.size() * sizeof(T)), 0) << what;
  if (c.weighted) EXPECT_EQ(std::memcmp(dw.data(), dw2.data(), dw.size() * 4), 0) << what;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t N : {64, 128, 256}) {
    // 37 rows: not a multiple of any block's rows (128 / lanes: 16, 8 or 4 for bfloat16).
    out.push_back({37, N, true, true, cakeActivationSilu});
    out.push_back({37, N, true, true, cakeActivationSigmoid, 1.0, true});
    out.push_back({21, N, false, true, cakeActivationSilu, 1e3});
    out.push_back({21, N, true, false, cakeActivationSigmoid});
    out.push_back({13, N, false, false, cakeActivationSilu, 1.0, true});
  }
  out.push_back({9, 8, true, true, cakeActivationSilu});     // one vector a row (bfloat16)
  out.push_back({9, 1024, true, true, cakeActivationSilu});  // the widest rows
  // Vector counts that are no power of two (bfloat16: 3, 12, 25, 125 vectors a row over 4, 16,
  // 32 and 32 lanes; float32: 6, 24, 50, 250, the last on 8 slots a lane).
  for (int64_t N : {24, 96, 200, 1000}) {
    out.push_back({19, N, true, true, cakeActivationSilu});
    out.push_back({19, N, false, true, cakeActivationSigmoid, 1.0, true});
  }
  return out;
}

TEST(EmulatedNorm, Bfloat16MatchesReference) {
  uint64_t seed = 1;
  for (Case const& c : cases()) check_case<__nv_bfloat16>(c, seed++);
}

TEST(EmulatedNorm, Float16MatchesReference) {
  uint64_t seed = 50;
  for (Case const& c : cases()) check_case<__half>(c, seed++);
}

TEST(EmulatedNorm, Float32MatchesReference) {
  uint64_t seed = 100;
  for (Case const& c : cases()) check_case<float>(c, seed++);
}

// No rows: the forward writes nothing, and the backward's dweight is zeros (the reduce over no
// blocks), not what the buffer held.
TEST(EmulatedNorm, NoRows) {
  int64_t const N = 128;
  std::vector<__nv_bfloat16> x(N), g(N), dy(N), dx(N), dg(N);  // 0 rows of them are read
  std::vector<float> weight(N, 1.f), rstd(1), dweight = poisoned<float>(N);
  std::vector<int64_t> const rows_shape = {0, N};
  cakeRmsNormForwardArgs_t fa{};
  fa.struct_size = sizeof fa;
  fa.activation = cakeActivationSilu;
  fa.eps = 1e-5;
  fa.x = cuda_view(x.data(), rows_shape);
  fa.g = cuda_view(g.data(), rows_shape);
  fa.weight = cuda_view(weight.data(), {N});
  fa.y = cuda_view(dx.data(), rows_shape);
  fa.rstd = cuda_view(rstd.data(), {0});
  ASSERT_EQ(cakeRmsNormForward(&fa, nullptr), cakeSuccess) << cakeGetLastError();
  cakeRmsNormBackwardArgs_t ba =
      backward_args(fa, cuda_view(dy.data(), rows_shape), cuda_view(dx.data(), rows_shape),
                    cuda_view(dg.data(), rows_shape), cuda_view(dweight.data(), {N}));
  size_t bytes = 1;
  ASSERT_EQ(cakeRmsNormBackwardWorkspaceSize(&ba, &bytes), cakeSuccess) << cakeGetLastError();
  std::vector<unsigned char> ws(bytes + 16);
  ASSERT_EQ(cakeRmsNormBackward(&ba, bytes ? ws.data() : nullptr, bytes, nullptr), cakeSuccess)
      << cakeGetLastError();
  for (int64_t c = 0; c < N; ++c) EXPECT_EQ(dweight[c], 0.f) << "column " << c;
}

// More rows than kMaxBlocks blocks hold at once: each block walks several steps and its dweight
// sum spans them. N = 8 in float32 takes 2 lanes a row, 64 rows a block.
TEST(EmulatedNorm, BlocksWalkSeveralSteps) {
  int64_t const rows_per_step = cake::kernels::norm::kMaxBlocks * 64;
  cake::kernels::norm::RowLayout const layout =
      cake::kernels::norm::row_layout(2 * rows_per_step + 5, 8, 4);
  ASSERT_EQ(layout.lanes, 2);
  ASSERT_EQ(layout.num_blocks, cake::kernels::norm::kMaxBlocks);
  check_case<float>({2 * rows_per_step + 5, 8, true, true, cakeActivationSilu}, 500);
}

}  // namespace
