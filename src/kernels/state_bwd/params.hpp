// Host <-> device contract of the backward state walk (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::state_bwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;     // [BT, H, K]
  __nv_bfloat16 const* k = nullptr;     // [BT, H, K]
  __nv_bfloat16 const* w = nullptr;     // [BT, HV, K]
  float const* gcum = nullptr;          // [BT, HV]
  __nv_bfloat16 const* dout = nullptr;  // [BT, HV, V]
  float const* dht = nullptr;           // [N, HV, K, V] or nullptr (zero)
  __nv_bfloat16* dh = nullptr;          // [num_slots, HV, K, V] out: dS' of each chunk's end state
  float* dv_new = nullptr;              // [BT, HV, V] in: A^T dO; out: the whole dDelta
  float* dh0 = nullptr;                 // [N, HV, K, V] out or nullptr
};

}  // namespace cake::kernels::state_bwd
