// Host <-> device contract of the norm's forward stage (kernel.cuh says what it computes).
#pragma once

#include <cstdint>

#include "cake/cake.h"
#include "kernels/common/norm_rows.hpp"

namespace cake::kernels::norm_fwd {

struct Params {
  int64_t rows = 0;
  int32_t dim = 0;         // N, a multiple of 8, at most 1024
  norm::RowLayout layout;  // of rows, dim and x's dtype
  int32_t activation = 0;  // cakeActivation_t of the gate
  float eps = 0.f;
  cakeDtype_t x_dtype = cakeBfloat16;  // x, g, y
  void const* x = nullptr;             // [rows, N]
  void const* g = nullptr;             // [rows, N], or nullptr (no gate)
  void const* weight = nullptr;        // [N], or nullptr (ones)
  cakeDtype_t weight_dtype = cakeFloat32;
  void* y = nullptr;      // [rows, N] out
  float* rstd = nullptr;  // [rows] out
};

}  // namespace cake::kernels::norm_fwd
