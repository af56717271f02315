// How the norm's kernels (norm_fwd, norm_bwd) spread rows of N values over a block's lanes; host
// code (the op's launch and workspace size) and device code (the kernels) share it.
//
// A row is read in 16-byte vectors, N * bytes / 16 of them. `lanes` consecutive lanes of a warp
// (a power of two, at most 32) share a row, each holding `slots` vectors: lane `part` of the row
// holds vectors part + lanes * s, s < slots, those below the row's count. Rows narrower than a
// warp thus take fewer lanes and a warp holds 32 / lanes rows; wider ones take more slots.
// Blocks walk the rows grid-stride, at most kMaxBlocks of them, so that the backward's per-block
// partial sums of dweight stay few.
#pragma once

#include <cstdint>

namespace cake::kernels::norm {

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int64_t kMaxBlocks = 8 * 132;  // 8 blocks per SM of an H100 or H200

struct RowLayout {
  int vectors = 0;  // 16-byte vectors per row
  int lanes = 0;    // lanes per row
  int slots = 0;    // vectors per lane
  int64_t num_blocks = 0;
};

// N * element_bytes a multiple of 16 (the op admits N a multiple of 8).
constexpr RowLayout row_layout(int64_t rows, int dim, int element_bytes) {
  RowLayout r;
  r.vectors = dim * element_bytes / 16;
  int span = 1;  // lanes * slots: the vectors rounded up to a power of two
  while (span < r.vectors) span *= 2;
  r.lanes = span < 32 ? span : 32;
  r.slots = span / r.lanes;
  int64_t const rows_per_block = kThreads / r.lanes;
  int64_t const blocks = (rows + rows_per_block - 1) / rows_per_block;
  r.num_blocks = blocks < kMaxBlocks ? blocks : kMaxBlocks;
  return r;
}

}  // namespace cake::kernels::norm
