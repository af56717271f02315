// Host <-> device contract of the conv's backward stage (kernel.cuh says what it computes), and
// the one function that lays out its workspace (the op's byte query and its launch both use it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cake/cake.h"

namespace cake::kernels::conv1d_bwd {

inline constexpr int kThreads = 128;
// Channels per thread for x of x_bytes bytes an element: 8- or 16-byte loads (8 bfloat16
// channels a thread spill registers at W = 4).
constexpr int channels_per_thread(int) { return 4; }
// A tile of 32..256 tokens: the largest that still gives kMinBlocks blocks (8 per SM of an H200),
// so that large packs write few partial sums and small ones still fill the GPU.
inline constexpr int64_t kMaxTileTokens = 256;
inline constexpr int64_t kMinTileTokens = 32;
inline constexpr int64_t kMinBlocks = 8 * 132;

struct Params {
  int64_t num_tokens = 0;              // BT: B * T, all documents packed token-major
  int64_t seq_len = 0;                 // T: document length without cu_seqlens
  int64_t num_seqs = 0;                // N
  int32_t dim = 0;                     // D
  int32_t width = 0;                   // W, 2..4
  int32_t activation = 0;              // cakeActivation_t
  cakeDtype_t x_dtype = cakeBfloat16;  // x, dy, dx, dresidual
  bool vectorised = false;             // D % V == 0 and the token-major bases aligned to V elements
  bool bulk_rows = false;              // D sizeof(T) % 16 == 0, x and dy 16-byte aligned
  void const* x = nullptr;             // [BT, D]
  void const* dy = nullptr;            // [BT, D]
  void* dx = nullptr;                  // [BT, D] out, or nullptr
  void* dresidual = nullptr;           // [BT, D] out (= dy), or nullptr
  void const* weight = nullptr;        // [D, W]
  cakeDtype_t weight_dtype = cakeFloat32;
  void const* bias = nullptr;  // [D] or nullptr
  cakeDtype_t bias_dtype = cakeFloat32;
  void const* initial_state = nullptr;  // [N, D, W] or nullptr
  cakeDtype_t initial_state_dtype = cakeFloat32;
  void const* dht = nullptr;  // [N, D, W] or nullptr (zero)
  cakeDtype_t dht_dtype = cakeFloat32;
  void* dweight = nullptr;  // [D, W] out, or nullptr
  cakeDtype_t dweight_dtype = cakeFloat32;
  void* dbias = nullptr;  // [D] out, or nullptr
  cakeDtype_t dbias_dtype = cakeFloat32;
  void* dinitial_state = nullptr;  // [N, D, W] out, or nullptr
  cakeDtype_t dinitial_state_dtype = cakeFloat32;
  void const* cu_seqlens = nullptr;  // [N + 1] or nullptr
  bool cu_int64 = false;
  int64_t tile_tokens = 0;  // tokens per tile (Workspace::tile_tokens)
  int64_t num_tiles = 0;
  float* dweight_partial = nullptr;  // [num_tiles, D, W]: each tile's sum, or nullptr
  float* dbias_partial = nullptr;    // [num_tiles, D], or nullptr
};

// The workspace: per-tile partial sums of dweight and dbias (only those wanted), each region
// 256-byte aligned, reduced in tile order by the stage's last kernel.
struct Workspace {
  int64_t tile_tokens = 0;
  int64_t num_tiles = 0;
  size_t dweight_offset = 0, dbias_offset = 0;
  size_t bytes = 0;
};

inline Workspace workspace_layout(int64_t num_tokens, int64_t dim, int64_t width, int x_bytes,
                                  bool dweight, bool dbias) {
  auto const ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  auto const align = [](size_t n) { return (n + 255) / 256 * 256; };
  int64_t const channel_blocks = ceil_div(dim, kThreads * channels_per_thread(x_bytes));
  Workspace w;
  w.tile_tokens = kMaxTileTokens;
  while (w.tile_tokens > kMinTileTokens &&
         ceil_div(num_tokens, w.tile_tokens) * channel_blocks < kMinBlocks) {
    w.tile_tokens /= 2;
  }
  w.num_tiles = ceil_div(num_tokens, w.tile_tokens);
  size_t const tile_floats = static_cast<size_t>(w.num_tiles) * static_cast<size_t>(dim);
  w.dweight_offset = 0;
  size_t const dweight_bytes = dweight ? align(tile_floats * width * sizeof(float)) : 0;
  w.dbias_offset = dweight_bytes;
  w.bytes = dweight_bytes + (dbias ? align(tile_floats * sizeof(float)) : 0);
  return w;
}

}  // namespace cake::kernels::conv1d_bwd
