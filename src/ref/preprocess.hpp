// The optional per-token transforms applied before the recurrence, and their backward, in FP64:
//   q/k L2 norm (use_qk_l2norm_in_kernel), the gate activation (use_gate_in_kernel) and the beta
//   sigmoid (use_beta_sigmoid_in_kernel). All arrays dense and token-major.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace cake::ref {

// y = x / sqrt(sum x^2 + 1e-6) per row of `width` elements; rstd = 1 / sqrt(sum x^2 + 1e-6).
void l2norm_forward(std::vector<double> const& x, int64_t width, std::vector<double>& y,
                    std::vector<double>& rstd);
// dx = rstd (dy - (dy . y) y) per row.
std::vector<double> l2norm_backward(std::vector<double> const& dy, std::vector<double> const& y,
                                    std::vector<double> const& rstd, int64_t width);

// The gate computed in the kernel from a raw gate g_raw [T, HV, W] (W = 1 for GDN, K for KDA):
//   default:      g = -exp(A_log[hv]) softplus(g_raw + dt_bias)
//   lower bound:  g = lower_bound sigmoid(exp(A_log[hv]) (g_raw + dt_bias))   (A_log optional)
// dt_bias is [HV * W] (optional); A_log is [HV].
struct GateParams {
  int64_t num_v_heads = 0;  // HV
  int64_t width = 1;        // W: 1 (GDN) or K (KDA)
  std::vector<double> A_log;    // [HV], or empty (lower-bound form only)
  std::vector<double> dt_bias;  // [HV * W], or empty
  std::optional<double> lower_bound;
};

std::vector<double> gate_forward(GateParams const& p, std::vector<double> const& g_raw);

struct GateGrads {
  std::vector<double> dg_raw;    // [T, HV, W]
  std::vector<double> dA_log;    // [HV] (empty when A_log is)
  std::vector<double> ddt_bias;  // [HV * W] (empty when dt_bias is)
};
GateGrads gate_backward(GateParams const& p, std::vector<double> const& g_raw,
                        std::vector<double> const& dg);

// beta = c sigmoid(beta_raw), c = 2 when negative eigenvalues are allowed, else 1.
std::vector<double> beta_sigmoid_forward(std::vector<double> const& beta_raw, double c);
std::vector<double> beta_sigmoid_backward(std::vector<double> const& beta_raw, double c,
                                          std::vector<double> const& dbeta);

}  // namespace cake::ref
