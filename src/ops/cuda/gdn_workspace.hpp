// The one layout of the GDN GPU workspace: the same function sizes it (base == nullptr) and carves
// the caller's buffer into the intermediate tensors of forward and backward.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/problem.hpp"

namespace cake::ops::cuda {

struct GdnBuffers {
  // forward (and the backward's recompute)
  __nv_bfloat16* q_norm = nullptr;  // [BT, H, K]   with use_qk_l2norm
  __nv_bfloat16* k_norm = nullptr;  // [BT, H, K]   with use_qk_l2norm
  float* gcum = nullptr;            // [BT, HV]     G, within-chunk cumsum of g
  __nv_bfloat16* w = nullptr;       // [BT, HV, K]  W (backward: reused for dW once read)
  __nv_bfloat16* u = nullptr;       // [BT, HV, V]  U
  __nv_bfloat16* v_new = nullptr;   // [BT, HV, V]  Delta = U - W h
  __nv_bfloat16* h = nullptr;       // [num_slots, HV, K, V] chunk-start states
  // backward only
  float* tmat = nullptr;            // [BT, HV, 64] T = (I + L)^-1 rows
  float* dv_new = nullptr;          // [BT, HV, V]  dDelta (first its intra-chunk part)
  __nv_bfloat16* dh = nullptr;      // [num_slots, HV, K, V] gradients of chunk-end states
  float* dq_hv = nullptr;           // [BT, HV, K]
  float* dk_hv = nullptr;           // [BT, HV, K]
  float* dg_part = nullptr;         // [BT, HV]     dG from the output and state terms
  size_t bytes = 0;                 // total, including alignment slack for any base address
};

// Carves `base` (nullptr: only count) for problem p.
GdnBuffers carve_gdn_workspace(kernels::Problem const& p, bool use_qk_l2norm, bool backward,
                               void* base);

}  // namespace cake::ops::cuda
