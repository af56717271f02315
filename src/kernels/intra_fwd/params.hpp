// Host <-> device contract of the intra-chunk forward stage (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::intra_fwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* k = nullptr;  // [BT, H, K]
  __nv_bfloat16 const* v = nullptr;  // [BT, HV, V]
  float const* g = nullptr;          // [BT, HV]      natural-log decay per token
  void const* beta = nullptr;        // [BT, HV]      fp32, or bf16 when beta_is_bf16
  bool beta_is_bf16 = false;
  float* gcum = nullptr;             // [BT, HV]      out: G, inclusive cumsum of g in the chunk
  __nv_bfloat16* w = nullptr;        // [BT, HV, K]   out: W = T diag(beta) (K e^G)
  __nv_bfloat16* u = nullptr;        // [BT, HV, V]   out: U = T diag(beta) V
  float* tmat = nullptr;             // [BT, HV, 64]  out or nullptr: row t of its chunk's T
};

}  // namespace cake::kernels::intra_fwd
