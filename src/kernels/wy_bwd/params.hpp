// Host <-> device contract of the WY-representation backward (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::wy_bwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* k = nullptr;   // [BT, H, K]
  __nv_bfloat16 const* v = nullptr;   // [BT, HV, V]
  void const* beta = nullptr;         // [BT, HV]     fp32, or bf16 when beta_is_bf16
  bool beta_is_bf16 = false;
  float const* gcum = nullptr;        // [BT, HV]
  float const* tmat = nullptr;        // [BT, HV, 64] T rows
  __nv_bfloat16 const* dw = nullptr;  // [BT, HV, K]  dW
  float const* dv_new = nullptr;      // [BT, HV, V]  dU = dDelta
  float* dk_wy_hv = nullptr;          // [BT, HV, K]  out: dk's WY terms per value head
  float const* dg_part = nullptr;     // [BT, HV]     dG from dqk_bwd
  __nv_bfloat16* dv = nullptr;        // [BT, HV, V]  out, or nullptr
  void* dbeta = nullptr;              // [BT, HV]     out (beta's dtype), or nullptr
  bool dbeta_is_bf16 = false;
  float* dg = nullptr;                // [BT, HV]     out, or nullptr: gradient of the per-token g
};

}  // namespace cake::kernels::wy_bwd
