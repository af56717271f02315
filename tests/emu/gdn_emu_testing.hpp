// What the emulated kernel tests add to gdn_testing.hpp: errors against a reference pooled over
// draws, the line and verdict of a case, and the element types (bf16, fp16, fp32) to and from
// double, random and poisoned buffers of them, and host buffers seen as CUDA tensors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor.hpp"
#include "gdn_testing.hpp"

namespace cake::emu_testing {

using gdn_testing::K;

// Relative RMS and max-abs / max|ref| of got against ref, and whether all are finite, pooled
// over the draws added (one draw of these small problems leaves dg's relative error a long tail:
// a few elements can carry the reference's norm).
struct Errors {
  double num = 0, den = 0, max_err = 0, max_ref = 0;
  bool finite = true;

  template <class T>
  void add(std::vector<T> const& got, std::vector<double> const& ref) {
    for (size_t i = 0; i < ref.size(); ++i) {
      double const x = static_cast<double>(got[i]);
      if (!std::isfinite(x)) finite = false;
      double const d = x - ref[i];
      num += d * d;
      den += ref[i] * ref[i];
      max_err = std::max(max_err, std::abs(d));
      max_ref = std::max(max_ref, std::abs(ref[i]));
    }
  }
  double rel_rms() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
  double max_rel() const { return max_ref > 0 ? max_err / max_ref : max_err; }
  bool pass() const { return finite && rel_rms() <= 1e-2 && max_rel() <= 2e-2; }
};

// One draw's errors of got against ref.
template <class T>
Errors errors(std::vector<T> const& got, std::vector<double> const& ref) {
  Errors e;
  e.add(got, ref);
  return e;
}

// Each output's errors, pooled over the draws of a case, in a fixed order.
using Pool = std::vector<std::pair<char const*, Errors>>;

// Prints one line for a case (each output's rel-RMS / max-abs over max|ref|, "!" where over the
// gate) and fails the test where any output is over the gate.
inline void expect_pass(std::string const& label, Pool const& pool) {
  std::string line = label + ":";
  bool ok = true;
  for (auto const& [name, e] : pool) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s %.1e/%.1e%s", name, e.rel_rms(), e.max_rel(),
                  e.pass() ? "" : "!");
    line += buf;
    ok = ok && e.pass();
  }
  std::printf("%s\n", line.c_str());
  EXPECT_TRUE(ok) << line;
}

// An output buffer of n elements filled with 0xff bytes (NaN as fp32 and bf16), so that elements a
// kernel does not write fail the comparison.
template <class T>
std::vector<T> poisoned(size_t n) {
  std::vector<T> x(n);
  std::memset(x.data(), 0xff, n * sizeof(T));
  return x;
}

// Each chunk's state in an [num_slots, HV, K, K] array: visit(n, j, hv, at) for chunk j of
// document n (slot slot_base(n) + j) and value head hv, `at` its first element, until a visit
// returns a verdict, which is returned ("" if none does).
template <class Visit>
std::string visit_chunk_states(gdn_testing::Problem const& pr, Visit const& visit) {
  kernels::Problem const kp = pr.kernel_problem();
  size_t const state = size_t{K} * K;
  for (int n = 0; n < pr.N; ++n) {
    int64_t const chunks = (pr.cu[n + 1] - pr.cu[n] + kernels::kChunk - 1) / kernels::kChunk;
    for (int64_t j = 0; j < chunks; ++j)
      for (int hv = 0; hv < pr.HV; ++hv) {
        std::string verdict = visit(n, j, hv, ((kp.slot_base(n) + j) * pr.HV + hv) * state);
        if (!verdict.empty()) return verdict;
      }
  }
  return "";
}

template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16(static_cast<float>(x));
  if constexpr (std::is_same_v<T, __half>) return __float2half(static_cast<float>(x));
  if constexpr (std::is_same_v<T, float>) return static_cast<float>(x);
}

template <class T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  if constexpr (std::is_same_v<T, float>) return x;
}

template <class T>
constexpr cakeDtype_t dtype_of() {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return cakeBfloat16;
  if constexpr (std::is_same_v<T, __half>) return cakeFloat16;
  return cakeFloat32;
}

template <class T>
std::vector<double> widen(std::vector<T> const& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_double(x[i]);
  return out;
}

// n values ~ N(0, scale^2) rounded to T.
template <class T>
std::vector<T> random_values(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<T> x(n);
  for (auto& e : x) e = from_double<T>(normal(rng));
  return x;
}

// A host buffer seen as a dense CUDA tensor (what the emulator runs on).
template <class T>
cakeTensor_t cuda_view(T const* data, std::vector<int64_t> const& shape) {
  return dense_view(const_cast<T*>(data), dtype_of<T>(), cakeCUDA, shape);
}

// x [BT, H, K] from its terms per value head x_hv [BT, HV, K]: each q/k head's value heads
// summed in ascending order (as qk_grad does).
template <class T>
std::vector<double> sum_over_groups(std::vector<T> const& x_hv, int64_t BT, int H, int HV) {
  std::vector<double> x(BT * H * K, 0.0);
  for (int64_t t = 0; t < BT; ++t)
    for (int hv = 0; hv < HV; ++hv)
      for (int i = 0; i < K; ++i) x[(t * H + hv / (HV / H)) * K + i] += x_hv[(t * HV + hv) * K + i];
  return x;
}

}  // namespace cake::emu_testing
