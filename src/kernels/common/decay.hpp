// The decay as a compile-time policy of the chunk stages: GDN decays the state by one scalar per
// token and value head, KDA by one factor per key channel. The policy says where the decay enters
// a stage; everything else (chunk lookup, tile loads, the triangular solve, the stores) is the
// same code for both.
//
//   ScalarDecay (GDN)  g, G: [BT, HV]      Gamma_ij = e^{G_i - G_j} is a scalar per pair, so
//                      Gamma o L = D L D^-1 (D = diag(e^G)): K K^T is formed ungated, once per
//                      q/k head and shared by its value heads, and the walks apply Gamma where
//                      they read A.
//   ChannelDecay (KDA) g, G: [BT, HV, K]   Gamma_ij is a K-vector inside the product,
//                      L_ij = beta_i sum_c k_ic k_jc e^{G_ic - G_jc}: no diagonal factoring, so
//                      the gated K K^T is formed per value head (channel_kkt.cuh) and A is the
//                      gated inverse T itself.
#pragma once

#include "kernels/common/problem.hpp"

namespace cake::kernels {

struct ScalarDecay {
  static constexpr int kWidth = 1;          // gate values per token and value head
  static constexpr bool kGatedKkt = false;  // K K^T formed without the gate
};

struct ChannelDecay {
  static constexpr int kWidth = kHeadDim;
  static constexpr bool kGatedKkt = true;
};

}  // namespace cake::kernels
