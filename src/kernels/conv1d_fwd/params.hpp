// Host <-> device contract of the conv's forward stage (kernel.cuh says what it computes).
#pragma once

#include <cstdint>

#include "cake/cake.h"

namespace cake::kernels::conv1d_fwd {

// Channels per thread for x of x_bytes bytes an element: 8- or 16-byte loads (8 bfloat16
// channels a thread take 200 registers).
constexpr int channels_per_thread(int) { return 4; }

struct Params {
  int64_t num_tokens = 0;              // BT: B * T, all documents packed token-major
  int64_t seq_len = 0;                 // T: document length without cu_seqlens
  int64_t num_seqs = 0;                // N
  int32_t dim = 0;                     // D
  int32_t width = 0;                   // W, 2..4
  int32_t activation = 0;              // cakeActivation_t
  cakeDtype_t x_dtype = cakeBfloat16;  // x, residual, y
  bool vectorised = false;             // D % V == 0 and the token-major bases aligned to V elements
  bool bulk_rows = false;              // D sizeof(T) % 16 == 0, x and residual 16-byte aligned
  void const* x = nullptr;             // [BT, D]
  void const* residual = nullptr;      // [BT, D] or nullptr
  void* y = nullptr;                   // [BT, D] out
  void const* weight = nullptr;        // [D, W]
  cakeDtype_t weight_dtype = cakeFloat32;
  void const* bias = nullptr;  // [D] or nullptr
  cakeDtype_t bias_dtype = cakeFloat32;
  void const* initial_state = nullptr;  // [N, D, W] or nullptr (zeros)
  cakeDtype_t initial_state_dtype = cakeFloat32;
  void* final_state = nullptr;  // [N, D, W] out, or nullptr
  cakeDtype_t final_state_dtype = cakeFloat32;
  void const* cu_seqlens = nullptr;  // [N + 1] or nullptr
  bool cu_int64 = false;
};

}  // namespace cake::kernels::conv1d_fwd
