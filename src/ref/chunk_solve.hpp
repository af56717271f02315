// Stage 2 (forward): the intra-chunk delta-rule system and its inverse ("KKT + solve_tril").
//
// Per chunk of n <= C rows and value head hv (q/k head h), G the chunk-local cumsum:
//   L_ij = beta_i <k_i, k_j * Gamma_ij>   for i > j, else 0        (n x n, strictly lower)
//   A    = T = (I + L)^-1                                          (n x n, unit lower)
// Gamma_ij = e^{G_i - G_j} is a scalar (GDN) or a K-vector multiplied channel by channel (KDA).
// T comes from forward substitution, row by row: T_i. = e_i - sum_{m < i} L_im T_m. .
//
// Writes A [T, HV, C]: the row of token t holds row r = t - begin of its chunk's T; columns
// >= r + 1 (the upper triangle and the columns past a partial chunk) are zero.
#pragma once

#include "ref/chunk_layout.hpp"

namespace cake::ref {

void chunk_solve_forward(Shape const& shape, ChunkTiling const& tiling,
                         double const* k,     // [T, H, K]
                         double const* beta,  // [T, HV]
                         double const* G,     // [T, HV] or [T, HV, K]
                         double* A);          // [T, HV, C]

}  // namespace cake::ref
