// The host's side of the TMA maps (tensor_map.hpp): encoded by the driver's
// cuTensorMapEncodeTiled, reached through the runtime's entry point (no link to libcuda). Under
// the CPU emulator, tests/emu/launch_emu.cpp defines the same functions with its own encoding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/common/tensor_map.hpp"

namespace cake::kernels {

// A tile map (tile_map_shape) of the bf16 [tokens, heads, cols] tensor at base.
cudaError_t encode_tile_map(TensorMap& map, void const* base, int64_t tokens, int heads, int cols);
// The h map (h_map_shape) of the bf16 [num_slots, HV, 128, 128] tensor at h.
cudaError_t encode_h_map(TensorMap& map, void const* h, int64_t num_slots, int HV);

}  // namespace cake::kernels
