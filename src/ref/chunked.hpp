// The chunked algorithm in FP64, stage by stage as the GPU kernels run it
// (docs/design/algorithm.md); the stage-level reference for the CUDA kernels.
//
// Per document, chunks of `chunk_size` tokens (the last one partial); per chunk c with incoming
// state S (K x V) and within-chunk inclusive cumsum G of g:
//   Gamma_ij = e^{G_i - G_j} (i >= j, formed pair by pair: e^{-G} alone overflows for g = -20)
//   L_ij = beta_i <k_i, k_j Gamma_ij> (i > j)      T = (I + L)^-1
//   W = T diag(beta) (K e^G)      U = T diag(beta) V         Delta = U - W S
//   O = scale (Q e^G) S + causal(scale <q_i, k_j Gamma_ij>) Delta
//   S' = e^{G_last} S + (K e^{G_last - G})^T Delta
// For KDA every e^G factor is a K-vector applied channel by channel.
//
// The stages, one file each: chunk_cumsum (1), chunk_solve (2), chunk_wy (3), chunk_state (4,
// and the reverse walk), chunk_output (5, and dDelta_intra), chunk_dqkw (6: dq, dk, dw, dG),
// chunk_wy_bwd (7: through W, U, T, L). The backward recomputes stages 1-4, then runs
// 5', 4', 6, 7 and finishes with the reverse cumsum of dG and the GVA sums of dq, dk (value heads
// in ascending order: bitwise reproducible for any thread count).
//
// Any chunk_size >= 1 works. h0 / dht == nullptr mean zero; ht / dh0 == nullptr mean not wanted.
// Every output is overwritten. In FP64 the results equal recurrent.hpp's to ~1e-14 relative,
// also at g = -20 per token (tests/cpp/test_chunked.cpp).
#pragma once

#include "ref/problem.hpp"

namespace cake::ref {

inline constexpr int kDefaultChunkSize = 64;

void chunked_forward(Shape const& shape, Inputs const& in, Outputs const& out,
                     int chunk_size = kDefaultChunkSize);

void chunked_backward(Shape const& shape, Inputs const& in, OutputGrads const& grad_out,
                      InputGrads const& grad_in, int chunk_size = kDefaultChunkSize);

}  // namespace cake::ref
