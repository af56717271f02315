// Host <-> device contract of the dq/dk/dW stage (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::dqk_bwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;      // [BT, H, K]
  __nv_bfloat16 const* k = nullptr;      // [BT, H, K]
  __nv_bfloat16 const* v_new = nullptr;  // [BT, HV, V]            Delta
  float const* gcum = nullptr;           // [BT, HV]
  __nv_bfloat16 const* dout = nullptr;   // [BT, HV, V]
  __nv_bfloat16 const* h = nullptr;      // [num_slots, HV, K, V]  chunk-start states
  __nv_bfloat16 const* dh = nullptr;     // [num_slots, HV, K, V]  gradients of chunk-end states
  float const* dv_new = nullptr;         // [BT, HV, V]            dDelta
  float* dq_h = nullptr;                 // [BT, H, K]  out: dq, summed over the value heads
  float* dk_h = nullptr;                 // [BT, H, K]  out: dk's output/state terms, likewise
  __nv_bfloat16* dw = nullptr;           // [BT, HV, K] out: dW = -dDelta h^T
  float* dg_part = nullptr;              // [BT, HV]    out: dG from the output and state terms
};

}  // namespace cake::kernels::dqk_bwd
