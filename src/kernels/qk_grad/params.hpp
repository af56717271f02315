// Host <-> device contract of the q/k gradient reduction (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace cake::kernels::qk_grad {

struct Params {
  int64_t num_tokens = 0;              // BT
  int32_t num_qk_heads = 0;            // H
  int32_t group_size = 0;              // HV / H
  bool use_l2norm = false;
  // With use_l2norm, the norm's outputs (qk_norm): read only then
  __nv_bfloat16 const* q_norm = nullptr;  // [BT, H, K] q̂ = q rstd_q, bf16
  __nv_bfloat16 const* k_norm = nullptr;  // [BT, H, K] k̂
  float const* q_rstd = nullptr;          // [BT, H]
  float const* k_rstd = nullptr;          // [BT, H]
  float const* dq_hv = nullptr;        // [BT, HV, K] dq's terms per value head (walk_a_bwd)
  float const* dk_hv = nullptr;        // [BT, HV, K] dk's terms per value head (walk_a_bwd)
  __nv_bfloat16* dq = nullptr;         // [BT, H, K]  out
  __nv_bfloat16* dk = nullptr;         // [BT, H, K]  out
};

}  // namespace cake::kernels::qk_grad
