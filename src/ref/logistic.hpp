// The logistic function, its slope and SiLU's slope in double, shared by the reference stages
// that use them (the gate and beta activations, the conv's SiLU, the output norm's gate).
#pragma once

#include <cmath>

namespace cake::ref {

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// sigmoid'(x) = s (1 - s), as e / (1 + e)^2 with e = e^-|x|: the product s (1 - s) loses 1 - s
// once s rounds to 1 (x above ~37 in double), where the slope is still ~e^-x.
inline double sigmoid_slope(double x) {
  double const e = std::exp(-std::fabs(x));
  return e / ((1.0 + e) * (1.0 + e));
}

// silu'(x) for silu(x) = x sigmoid(x): s (1 + x (1 - s)). Where s rounds to 1 the lost x (1 - s)
// is below x e^-x against a slope of ~1: no loss that matters.
inline double silu_slope(double x) {
  double const s = sigmoid(x);
  return s * (1.0 + x * (1.0 - s));
}

}  // namespace cake::ref
