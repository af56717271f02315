// A TMA tensor map as the kernels take it (a __grid_constant__ parameter): CUDA's CUtensorMap,
// 128 opaque bytes aligned to 128, filled on the host (by the driver's cuTensorMapEncodeTiled on
// the GPU; by emu::encode_tensor_map_3d under the CPU emulator, tests/emu). Declared here rather
// than taken from <cuda.h> so that the kernels' parameter structs stay free of driver headers.
#pragma once

#include <cstdint>

#include "kernels/common/problem.hpp"

namespace cake::kernels {

struct alignas(128) TensorMap {
  unsigned char bytes[128];
};

// The maps the walks use, all bf16 with the 128-byte swizzle (a box's rows of 64 columns land as
// a swizzled tile, wgmma.cuh):
// - a tile map: a [BT, heads, cols] tensor as 2-D (all heads' columns, tokens), boxes of 64
//   columns by one chunk's tokens: a head's [64 x 128] tile is two boxes, a [64 x 64] one one;
// - the h map: h [num_slots, HV, 128, 128] as 3-D (columns, rows, slot x HV + hv), boxes of 64
//   columns by 128 rows: a state is two boxes.
// encode_tile_map / encode_h_map (tensor_map_encode.hpp) pass these to the driver.
struct TileMapShape {
  uint64_t dims[2];  // elements: all heads' columns, tokens
  uint64_t stride;   // bytes: a token
  uint32_t box[2];   // 64 columns (128 bytes: the swizzle's span), a chunk's tokens
};
inline TileMapShape tile_map_shape(int64_t tokens, int heads, int cols) {
  return {{static_cast<uint64_t>(heads) * cols, static_cast<uint64_t>(tokens)},
          static_cast<uint64_t>(heads) * cols * 2,
          {64, kChunk}};
}
// TMA coordinates are int32 (a box's first token; a state, slot x HV + hv): an out-of-range box
// would be dropped (a store) or read as zeros (a load) without an error, so launch() refuses such
// problems. Memory makes them unreachable (2^31 tokens of one bf16 [HV, 128] tensor is 0.5 TB
// per head).
inline bool tma_coordinates_fit(int64_t tokens, int64_t num_slots, int HV) {
  return tokens <= INT32_MAX - kChunk && num_slots * HV <= INT32_MAX;
}
struct HMapShape {
  uint64_t dims[3];     // elements: columns, rows, slots x HV
  uint64_t strides[2];  // bytes: a row, a state
  uint32_t box[3];      // 64 columns (128 bytes), 128 rows, one state
};
inline HMapShape h_map_shape(int64_t num_slots, int HV) {
  return {{kHeadDim, kHeadDim, static_cast<uint64_t>(num_slots) * HV},
          {kHeadDim * 2, kHeadDim * kHeadDim * 2},
          {64, kHeadDim, 1}};
}

}  // namespace cake::kernels
