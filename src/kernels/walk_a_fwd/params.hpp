// Host <-> device contract of the forward walk on the un-gated inverse (kernel.cuh says what it
// computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::walk_a_fwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;  // [BT, H, K]
  __nv_bfloat16 const* k = nullptr;  // [BT, H, K]
  __nv_bfloat16 const* v = nullptr;  // [BT, HV, V]
  __nv_bfloat16 const* a = nullptr;  // [BT, HV, 64]    from kkt_solve: (I + diag(beta) L)^-1
  float const* gcum = nullptr;       // [BT, HV]        from kkt_solve
  float const* beta = nullptr;       // [BT, HV]        fp32 (a bf16 beta goes through a copy)
  float const* h0 = nullptr;         // [N, HV, K, V]   or nullptr (zero initial state)
  __nv_bfloat16* o = nullptr;        // [BT, HV, V]     out, or nullptr: the h-walk (no o)
  float* ht = nullptr;               // [N, HV, K, V]   out or nullptr: final state
  __nv_bfloat16* h = nullptr;        // [num_slots, HV, K, V] out or nullptr (required when
                                     //                 o == nullptr): bf16 chunk-start states
};

}  // namespace cake::kernels::walk_a_fwd
