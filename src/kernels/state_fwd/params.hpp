// Host <-> device contract of the forward state walk (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::state_fwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* k = nullptr;  // [BT, H, K]
  __nv_bfloat16 const* w = nullptr;  // [BT, HV, K]     from intra_fwd
  __nv_bfloat16 const* u = nullptr;  // [BT, HV, V]     from intra_fwd
  float const* gcum = nullptr;       // [BT, HV]        from intra_fwd
  float const* h0 = nullptr;         // [N, HV, K, V]   or nullptr (zero initial state)
  __nv_bfloat16* h = nullptr;        // [num_slots, HV, K, V] out: state at each chunk's start
  __nv_bfloat16* v_new = nullptr;    // [BT, HV, V]     out: Delta = U - W h
  float* ht = nullptr;               // [N, HV, K, V]   out or nullptr: final state
};

}  // namespace cake::kernels::state_fwd
