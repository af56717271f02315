// Host <-> device contract of the intra-chunk dDelta stage (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::dv_local_bwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;     // [BT, H, K]
  __nv_bfloat16 const* k = nullptr;     // [BT, H, K]
  float const* gcum = nullptr;          // [BT, HV]
  __nv_bfloat16 const* dout = nullptr;  // [BT, HV, V]
  float* dv_new = nullptr;              // [BT, HV, V] out: A^T dO
};

}  // namespace cake::kernels::dv_local_bwd
