// Host <-> device contract of the KDA intra pass (kernel.cuh says what it computes). Its inputs
// are the reverse walk's per-chunk outputs (ref/kda_walk_model.hpp, ReverseStep), row t of a
// [BT, HV, 64] array holding row t - t0 of its chunk's [64 x 64] matrix.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::intra_bwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;  // [BT, H, K]
  __nv_bfloat16 const* k = nullptr;  // [BT, H, K]
  float const* g = nullptr;          // [BT, HV, K]  natural-log decay (G is formed again here)
  void const* beta = nullptr;        // [BT, HV]     fp32, or bf16 when beta_is_bf16
  bool beta_is_bf16 = false;
  float const* dqk = nullptr;         // [BT, HV, 64] s mask_{i >= j}(dO Delta^T)
  float const* dl = nullptr;          // [BT, HV, 64] dL, strictly lower
  float const* dqg = nullptr;         // [BT, HV, K]  s dO h^T
  float const* dkg = nullptr;         // [BT, HV, K]  -(beta Z) h^T
  float const* dkbar = nullptr;       // [BT, HV, K]  Delta dS^T
  float const* dgamma = nullptr;      // [num_slots, HV, K]  rowdot(dS, h) per key row
  float const* dbeta_walk = nullptr;  // [BT, HV]     rowdot(Z, Rt)
  float* dq_sum = nullptr;            // [BT, H, K]   scratch: dq summed over the value heads
  float* dk_sum = nullptr;            // [BT, H, K]   before the last (group_size > 1 only)
  bool use_l2norm = false;            // q, k are qk_norm's q̂, k̂ (the norm's backward's y)
  float const* q_rstd = nullptr;      // [BT, H]      with use_l2norm
  float const* k_rstd = nullptr;      // [BT, H]      with use_l2norm
  __nv_bfloat16* dq = nullptr;        // [BT, H, K]   out or nullptr: dq, through the norm's
  __nv_bfloat16* dk = nullptr;        // [BT, H, K]   backward with use_l2norm, in bf16 (dk too)
  float* dg = nullptr;                // [BT, HV, K]  out or nullptr (not wanted)
  void* dbeta = nullptr;              // [BT, HV]     out or nullptr: fp32, or bf16 when
                                      //              dbeta_is_bf16
  bool dbeta_is_bf16 = false;
};

}  // namespace cake::kernels::intra_bwd
