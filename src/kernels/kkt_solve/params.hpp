// Host <-> device contract of the chunk inverse (kernel.cuh says what it computes). The gate's
// width W is the decay policy's: 1 (ScalarDecay, GDN) or K (ChannelDecay, KDA).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::kkt_solve {

struct Params {
  Problem problem;
  __nv_bfloat16 const* k = nullptr;  // [BT, H, K]
  float const* g = nullptr;          // [BT, HV, W]   natural-log decay per token
  void const* beta = nullptr;        // [BT, HV]      fp32, or bf16 when beta_is_bf16
  bool beta_is_bf16 = false;
  float* gcum = nullptr;       // [BT, HV]      out (ScalarDecay): G, inclusive cumsum of g in the
                               //               chunk
  float* beta_f32 = nullptr;   // [BT, HV]      out or nullptr: beta in fp32 (the walk's)
  __nv_bfloat16* a = nullptr;  // [BT, HV, 64]  out: row t of its chunk's A (bf16):
                               //   (I + diag(beta) strict-lower(K K^T))^-1, the K K^T gated
                               //   per channel with ChannelDecay; ChannelDecay: nullptr forms
                               //   the walks' operands alone (no product, no solve)
  // ChannelDecay only: G of each chunk's last token, per key channel (the walks' state decay;
  // nothing reads the rest of G, which the intra pass forms again from g)
  float* glast = nullptr;  // [num_slots, HV, K] out or nullptr
  // ChannelDecay only, each out or nullptr (aqk given whenever a is: P is formed beside S): the
  // output's intra-chunk attention and the walks' operands (the decay applied per channel,
  // rounded to bf16 once; G_last: G of the chunk's last token)
  __nv_bfloat16 const* q = nullptr;  // [BT, H, K]    read when aqk or qg is wanted
  __nv_bfloat16* aqk = nullptr;      // [BT, HV, 64]  P = s causal(Q K^T gated), diagonal in
  __nv_bfloat16* qg = nullptr;       // [BT, HV, K]   q o e^{G}
  __nv_bfloat16* kg = nullptr;       // [BT, HV, K]   k o e^{G}
  __nv_bfloat16* kbar = nullptr;     // [BT, HV, K]   k o e^{G_last - G}
};

// What a launch refuses: with the per-channel decay P is formed beside S from the same operands,
// so A comes with P (the kernel writes aqk whenever it writes a).
template <class Decay>
constexpr bool params_valid(Params const& p) {
  return !(Decay::kGatedKkt && p.a != nullptr && p.aqk == nullptr);
}

}  // namespace cake::kernels::kkt_solve
