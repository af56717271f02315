// A TMA tensor map as the kernels take it (a __grid_constant__ parameter): CUDA's CUtensorMap,
// 128 opaque bytes aligned to 128, filled on the host (by the driver's cuTensorMapEncodeTiled on
// the GPU; by emu::encode_tensor_map_3d under the CPU emulator, tests/emu). Declared here rather
// than taken from <cuda.h> so that the kernels' parameter structs stay free of driver headers.
#pragma once

namespace cake::kernels {

struct alignas(128) TensorMap {
  unsigned char bytes[128];
};

}  // namespace cake::kernels
