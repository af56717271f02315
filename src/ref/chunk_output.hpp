// Stage 5: the output ("chunk_fwd_o") and, in the backward, the intra-chunk part of dDelta
// ("chunk_bwd_dv_local"), which the reverse state walk (stage 4) needs before it starts.
//
// Per chunk with start state h (stage 4), Delta = v_new, e_i = e^{G_i}, Gamma_ij = e^{G_i - G_j}:
//   Aqk_ij = scale <q_i, k_j * Gamma_ij>    for i >= j, else 0    (causal, diagonal included)
//   o_i    = scale h^T (q_i * e_i) + sum_{j <= i} Aqk_ij Delta_j        (inter + intra)
// backward:
//   dDelta_intra_j = sum_{i >= j} Aqk_ij dO_i                          (Aqk^T dO)
#pragma once

#include "ref/chunk_layout.hpp"

namespace cake::ref {

void chunk_output_forward(Shape const& shape, ChunkTiling const& tiling, double scale,
                          double const* q,      // [T, H, K]
                          double const* k,      // [T, H, K]
                          double const* G,      // [T, HV] or [T, HV, K]
                          double const* h,      // [NT, HV, K, V]
                          double const* v_new,  // [T, HV, V]
                          double* o);           // [T, HV, V]

void chunk_output_backward_dv(Shape const& shape, ChunkTiling const& tiling, double scale,
                              double const* q,        // [T, H, K]
                              double const* k,        // [T, H, K]
                              double const* G,        // [T, HV] or [T, HV, K]
                              double const* d_o,      // [T, HV, V]
                              double* dv_new_intra);  // [T, HV, V]

}  // namespace cake::ref
