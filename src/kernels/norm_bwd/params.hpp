// Host <-> device contract of the norm's backward stage (kernel.cuh says what it computes), and
// the one function that lays out its workspace (the op's byte query and its launch both use it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cake/cake.h"
#include "kernels/common/norm_rows.hpp"

namespace cake::kernels::norm_bwd {

struct Params {
  int64_t rows = 0;
  int32_t dim = 0;                     // N, a multiple of 8, at most 1024
  norm::RowLayout layout;              // of rows, dim and x's dtype
  int32_t activation = 0;              // cakeActivation_t of the gate
  cakeDtype_t x_dtype = cakeBfloat16;  // x, g, dy, dx, dg
  void const* x = nullptr;             // [rows, N]
  void const* g = nullptr;             // [rows, N], or nullptr (no gate)
  void const* weight = nullptr;        // [N], or nullptr (ones)
  cakeDtype_t weight_dtype = cakeFloat32;
  float const* rstd = nullptr;  // [rows], the forward's
  void const* dy = nullptr;     // [rows, N]
  void* dx = nullptr;           // [rows, N] out, or nullptr
  void* dg = nullptr;           // [rows, N] out, or nullptr
  void* dweight = nullptr;      // [N] out, or nullptr
  cakeDtype_t dweight_dtype = cakeFloat32;
  float* dweight_partial = nullptr;  // [num_blocks, N]: each block's sum, with dweight
};

// The workspace: the blocks' partial sums of dweight (none without dweight), reduced in block
// order by the stage's last kernel.
struct Workspace {
  norm::RowLayout layout;
  size_t bytes = 0;
};

inline Workspace workspace_layout(int64_t rows, int dim, int x_bytes, bool dweight) {
  Workspace w;
  w.layout = norm::row_layout(rows, dim, x_bytes);
  w.bytes = dweight ? static_cast<size_t>(w.layout.num_blocks) * dim * sizeof(float) : 0;
  return w;
}

}  // namespace cake::kernels::norm_bwd
