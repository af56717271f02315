// Host <-> device contract of the forward walk (roles.cuh says what it computes), for the decay
// policy of the launch (common/decay.hpp): ScalarDecay (GDN) reads q, k, kkt_solve's un-gated A and
// G [BT, HV]; ChannelDecay (KDA) reads kkt_solve<ChannelDecay>'s gated A, P and the operands qg,
// kg, kbar in place of q and k, and G [BT, HV, K] (its chunks' last rows).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::walk_a_fwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;  // [BT, H, K]     ScalarDecay
  __nv_bfloat16 const* k = nullptr;  // [BT, H, K]     ScalarDecay
  __nv_bfloat16 const* v = nullptr;  // [BT, HV, V]
  __nv_bfloat16 const* a = nullptr;  // [BT, HV, 64]    from kkt_solve: (I + diag(beta) L)^-1
  float const* gcum = nullptr;       // [BT, HV]        from kkt_solve (ScalarDecay)
  float const* beta = nullptr;       // [BT, HV]        fp32 (a bf16 beta goes through a copy)
  float const* h0 = nullptr;         // [N, HV, K, V]   or nullptr (zero initial state)
  __nv_bfloat16* o = nullptr;        // [BT, HV, V]     out, or nullptr: the h-walk (no o)
  float* ht = nullptr;               // [N, HV, K, V]   out or nullptr: final state
  __nv_bfloat16* h = nullptr;        // [num_slots, HV, K, V] out or nullptr (required when
                                     //                 o == nullptr): bf16 chunk-start states
  // The h-walk only (o == nullptr), or nullptr: [N, HV] flags, zero before the launch; each CTA
  // of walk (n, hv) adds the number of h's 64-column slices it stored (all 2, or its 1 where the
  // walks are split: split.hpp) once they are stored (signal_flag), so the flag is 2 once all of
  // the walk's h is; and the grid lets the reverse walk launch at its start (launch_dependents),
  // so that each reverse walk starts as soon as its own h is there instead of after the last
  // h-walk (walk_a_bwd::Params::h_ready).
  int* walk_done = nullptr;
  // ChannelDecay: from kkt_solve<ChannelDecay>
  float const* glast = nullptr;         // [num_slots, HV, K] G of each chunk's last token
  __nv_bfloat16 const* qg = nullptr;    // [BT, HV, K]  q o e^G
  __nv_bfloat16 const* kg = nullptr;    // [BT, HV, K]  k o e^G
  __nv_bfloat16 const* kbar = nullptr;  // [BT, HV, K]  k o e^{G_last - G}
  __nv_bfloat16 const* aqk = nullptr;   // [BT, HV, 64] P (o only)
};

}  // namespace cake::kernels::walk_a_fwd
