// The logistic function and its slope in double, shared by the reference stages that use it
// (the gate and beta activations, the conv's SiLU, the output norm's gate).
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

}  // namespace cake::ref
