// Host <-> device contract of the q/k L2-norm stage (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace cake::kernels::qk_norm {

struct Params {
  int64_t num_rows = 0;                  // BT * H
  __nv_bfloat16 const* q = nullptr;      // [BT, H, K]
  __nv_bfloat16 const* k = nullptr;      // [BT, H, K]
  __nv_bfloat16* q_norm = nullptr;       // [BT, H, K] out
  __nv_bfloat16* k_norm = nullptr;       // [BT, H, K] out
  float* q_rstd = nullptr;               // [BT, H] out: each row's 1 / sqrt(sum x^2 + 1e-6)
  float* k_rstd = nullptr;               // [BT, H] out (qk_grad's norm backward reads both)
};

}  // namespace cake::kernels::qk_norm
