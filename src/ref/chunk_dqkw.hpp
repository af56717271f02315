// Backward stage 6: the input gradients that flow through the output and the chunk-end state
// ("chunk_bwd_dqkwg"). Chunk-parallel: it reads each chunk's start state h and its end-state
// gradient dS = dh from stage 4, so it needs no walk of its own.
//
// Per chunk, Delta = v_new, dDelta = dv_new (total, from stage 4), e_i = e^{G_i},
// ebar_i = e^{G_last - G_i}, gamma = e^{G_last}, Gamma_ij = e^{G_i - G_j}:
//   ds_ij = scale <dO_i, Delta_j>                     for j <= i   (gradient of <q_i, k_j
//   Gamma_ij>) dq_i  = scale e_i * (h dO_i) + sum_{j <= i} ds_ij k_j * Gamma_ij dk_j  = ebar_j *
//   (dS Delta_j) + sum_{i >= j} ds_ij q_i * Gamma_ij dw_i  = -h dDelta_i (Delta = U - W h) dG    =
//   the same terms differentiated in G, pair by pair:
//     e_i:           dG_i += q_i * dq_i^{inter}
//     Gamma_ij, j<i: dG_i += q_i * ds_ij k_j Gamma_ij,  dG_j -= the same
//     ebar_i, i<last: dG_last += k_i * dk_i^{inter},   dG_i -= the same
//     gamma:         dG_last += gamma * rowsum(h * dS)
// This equals FLA's dG = q * dq - k * dk (+ last-row terms) but leaves out the pairs whose
// factor is 1 (Gamma_ii, ebar_last) instead of adding and subtracting them: at g = -20 per token
// dg is ~e^-20 while those terms are O(1), and their rounding would swamp it.
// Products with e, ebar, Gamma and the dG terms are per key channel; for GDN dG is the sum over
// the channels. dq, dk are per value head here; the WY stage adds its dk and dG terms.
#pragma once

#include "ref/chunk_layout.hpp"

namespace cake::ref {

void chunk_dqkw(Shape const& shape, ChunkTiling const& tiling, double scale,
                double const* q,       // [T, H, K]
                double const* k,       // [T, H, K]
                double const* G,       // [T, HV] or [T, HV, K]
                double const* h,       // [NT, HV, K, V] chunk-start states
                double const* v_new,   // [T, HV, V]
                double const* d_o,     // [T, HV, V]
                double const* dh,      // [NT, HV, K, V] chunk-end state gradients
                double const* dv_new,  // [T, HV, V]
                double* dq,            // [T, HV, K] per value head
                double* dk,            // [T, HV, K] per value head
                double* dw,            // [T, HV, K]
                double* dG);           // [T, HV] or [T, HV, K]: gradient of the cumsum G

}  // namespace cake::ref
