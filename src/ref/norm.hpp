// The gated RMSNorm of flash-linear-attention's FusedRMSNormGated (RMSNorm without a gate), in
// FP64: the ground truth of the norm op's tests and its CPU path.
//
// Per row of N values (x [rows, N]):
//   rstd = 1 / sqrt(mean(x^2) + eps)       n = x rstd       y = n weight act(g)
// with weight = 1 and act(g) = 1 where they are absent, act silu(g) = g sigmoid(g) or sigmoid(g).
// Backward, with a = act(g) and dn = dy weight a:
//   dx = rstd (dn - n mean(dn n))    dg = dy n weight act'(g)    dweight = sum_rows dy n a
// where act'(g) = s (1 + g (1 - s)) for silu and s (1 - s) for sigmoid, s = sigmoid(g).
#pragma once

#include <cstdint>

namespace cake::ref {

enum class GateActivation { kSilu, kSigmoid };

struct NormShape {
  int64_t rows = 0;
  int64_t dim = 0;  // N
};

struct NormInputs {
  double const* x = nullptr;       // [rows, N]
  double const* g = nullptr;       // [rows, N], or nullptr (no gate)
  double const* weight = nullptr;  // [N], or nullptr (ones)
  double eps = 0.0;
  GateActivation activation = GateActivation::kSilu;
};

// y [rows, N] and rstd [rows].
void rms_norm_forward(NormShape const& shape, NormInputs const& in, double* y, double* rstd);

// Gradients, each overwritten; a nullptr one is not computed.
struct NormGrads {
  double* dx = nullptr;       // [rows, N]
  double* dg = nullptr;       // [rows, N], with g
  double* dweight = nullptr;  // [N], with weight
};

// rstd [rows] as the forward wrote it (in.eps is not read); dy [rows, N].
void rms_norm_backward(NormShape const& shape, NormInputs const& in, double const* rstd,
                       double const* dy, NormGrads const& grads);

}  // namespace cake::ref
