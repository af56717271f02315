// Small dense FP64 matrices for the FP64 models of the GPU stages (gdn_walk_model.hpp,
// kda_walk_model.hpp): row-major std::vector<double>, a product with optional transposes, and a
// chunk's rows of a token-major array.
#pragma once

#include <cstdint>
#include <vector>

namespace cake::ref::dense {

using Mat = std::vector<double>;  // row-major

// C = op(A) op(B) for row-major A [m x k] (or [k x m] when ta), B [k x n] (or [n x k] when tb).
inline Mat matmul(Mat const& a, Mat const& b, int64_t m, int64_t k, int64_t n, bool ta = false,
                  bool tb = false) {
  Mat c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      double const aip = ta ? a[p * m + i] : a[i * k + p];
      if (aip == 0.0) continue;
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += aip * (tb ? b[j * k + p] : b[p * n + j]);
    }
  return c;
}

// The chunk's rows [t0, t0 + c) of head `head` of a [T, heads, d] array, as a [c x d] matrix.
inline Mat rows(double const* x, int64_t t0, int64_t c, int64_t heads, int64_t head, int64_t d) {
  Mat m(c * d);
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j < d; ++j) m[i * d + j] = x[((t0 + i) * heads + head) * d + j];
  return m;
}

}  // namespace cake::ref::dense
