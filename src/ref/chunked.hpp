// The chunked algorithm in FP64, stage by stage as the GPU kernels run it (docs/design/algorithm.md).
//
// Per document, chunks of `chunk_size` tokens (the last one partial); per chunk c with incoming
// state S (K x V) and within-chunk inclusive cumsum G of g:
//   Gamma_ij = e^{G_i - G_j} (i >= j, formed pair by pair: e^{-G} alone overflows for g = -20)
//   L_ij = beta_i <k_i, k_j Gamma_ij> (i > j)      T = (I + L)^-1
//   W = T diag(beta) (K e^G)      U = T diag(beta) V         Delta = U - W S
//   O = scale (Q e^G) S + causal(scale <q_i, k_j Gamma_ij>) Delta
//   S' = e^{G_last} S + (K e^{G_last - G})^T Delta
// Backward runs the reverse state walk (dS) then the per-chunk input gradients (§2.4 of the
// FLA reference). In FP64 the results equal recurrent.hpp's to ~1e-12 relative.
#pragma once

#include "ref/problem.hpp"

namespace cake::ref {

inline constexpr int kDefaultChunkSize = 64;

void chunked_forward(Shape const& shape, Inputs const& in, Outputs const& out,
                     int chunk_size = kDefaultChunkSize);

void chunked_backward(Shape const& shape, Inputs const& in, OutputGrads const& grad_out,
                      InputGrads const& grad_in, int chunk_size = kDefaultChunkSize);

}  // namespace cake::ref
