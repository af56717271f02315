// Host <-> device contract of the output stage (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::output_fwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;      // [BT, H, K]
  __nv_bfloat16 const* k = nullptr;      // [BT, H, K]
  __nv_bfloat16 const* v_new = nullptr;  // [BT, HV, V]            Delta, from state_fwd
  float const* gcum = nullptr;           // [BT, HV]               G, from intra_fwd
  __nv_bfloat16 const* h = nullptr;      // [num_slots, HV, K, V]  chunk-start states
  __nv_bfloat16* o = nullptr;            // [BT, HV, V]            out
};

}  // namespace cake::kernels::output_fwd
