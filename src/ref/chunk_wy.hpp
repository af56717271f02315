// Stage 3 (forward): the WY representation of the chunk's delta-rule updates ("recompute_w_u").
//
// Per chunk (rows i, j < n) with T from stage 2, e_j = e^{G_j} (scalar or K-vector):
//   W = T diag(beta) (K * e^G)     w_i = sum_{j <= i} T_ij beta_j (k_j * e_j)      n x K
//   U = T diag(beta) V             u_i = sum_{j <= i} T_ij beta_j v_j              n x V
// so that the chunk's corrections are Delta = U - W h for its start state h (stage 4).
#pragma once

#include "ref/chunk_layout.hpp"

namespace cake::ref {

void chunk_wy_forward(Shape const& shape, ChunkTiling const& tiling,
                      double const* k,     // [T, H, K]
                      double const* v,     // [T, HV, V]
                      double const* beta,  // [T, HV]
                      double const* G,     // [T, HV] or [T, HV, K]
                      double const* A,     // [T, HV, C]: T = (I + L)^-1 row by row
                      double* w,           // [T, HV, K]
                      double* u);          // [T, HV, V]

}  // namespace cake::ref
