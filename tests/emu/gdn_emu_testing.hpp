// What the emulated kernel tests add to gdn_testing.hpp: errors against a reference pooled over
// draws, and bf16 outputs widened for them.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

// An output buffer of n elements filled with 0xff bytes (NaN as fp32 and bf16), so that elements a
// kernel does not write fail the comparison.
template <class T>
std::vector<T> poisoned(size_t n) {
  std::vector<T> x(n);
  std::memset(x.data(), 0xff, n * sizeof(T));
  return x;
}

inline std::vector<double> widen(std::vector<__nv_bfloat16> const& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __bfloat162float(x[i]);
  return out;
}

}  // namespace cake::emu_testing
