// Backward stage 7: the gradients that flow through the WY representation and the solve
// ("prepare_wy_repr_bwd"): W = T X, U = T Y, T = (I + L)^-1, with
//   X = diag(beta) (K * e^G)    Y = diag(beta) V    L_ij = beta_i <k_i, k_j * Gamma_ij> (i > j).
//
// Per chunk, from dW (stage 6) and dU = dDelta (stage 4):
//   dT = dW X^T + dU Y^T          dX = T^T dW          dY = T^T dU
//   dL = -T^T dT T^T              (strictly lower part: L has no other entries)
//   dv_i    = beta_i dY_i
//   dbeta_i = <dY_i, v_i> + <dX_i, k_i * e_i> + sum_{j < i} dL_ij <k_i, k_j * Gamma_ij>
//   dk_i   += beta_i e_i * dX_i + beta_i sum_{j < i} dL_ij k_j * Gamma_ij
//   dk_j   += sum_{i > j} beta_i dL_ij k_i * Gamma_ij
//   dG_i   += beta_i k_i * e_i * dX_i                                       (X carries e^{G_i})
//           + sum_{j < i} beta_i dL_ij k_i * k_j * Gamma_ij
//           - sum_{m > i} beta_m dL_mi k_m * k_i * Gamma_mi                 (Gamma_ij: +G_i, -G_j)
// dk and dG accumulate onto stage 6's values; dv and dbeta are written.
#pragma once

#include "ref/chunk_layout.hpp"

namespace cake::ref {

void chunk_wy_backward(Shape const& shape, ChunkTiling const& tiling,
                       double const* k,       // [T, H, K]
                       double const* v,       // [T, HV, V]
                       double const* beta,    // [T, HV]
                       double const* G,       // [T, HV] or [T, HV, K]
                       double const* A,       // [T, HV, C]: T = (I + L)^-1 row by row
                       double const* dw,      // [T, HV, K]
                       double const* dv_new,  // [T, HV, V]: dU
                       double* dk,            // [T, HV, K] per value head, accumulated
                       double* dv,            // [T, HV, V]
                       double* dbeta,         // [T, HV]
                       double* dG);           // [T, HV] or [T, HV, K], accumulated

}  // namespace cake::ref
