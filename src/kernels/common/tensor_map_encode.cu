#include "kernels/common/tensor_map_encode.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>

namespace cake::kernels {

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) &&
              alignof(TensorMap) == alignof(CUtensorMap));

namespace {

// The driver's cuTensorMapEncodeTiled, through the runtime's entry point (no link to libcuda), or
// nullptr.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 const encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A bf16 map of `rank` dimensions (innermost first; strides of dims 1 .. rank - 1 in bytes) over
// the tensor at base, boxes of `box` elements, 128-byte swizzled, zeros outside.
cudaError_t encode_swizzled_map(TensorMap& map, void const* base, cuuint32_t rank,
                                cuuint64_t const* dims, cuuint64_t const* strides,
                                cuuint32_t const* box) {
  PFN_cuTensorMapEncodeTiled_v12000 const encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  cuuint32_t const element_strides[3] = {1, 1, 1};
  CUresult const r = encode(reinterpret_cast<CUtensorMap*>(&map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                            rank, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t encode_tile_map(TensorMap& map, void const* base, int64_t tokens, int heads, int cols) {
  TileMapShape const m = tile_map_shape(tokens, heads, cols);
  cuuint64_t const dims[2] = {m.dims[0], m.dims[1]};
  cuuint64_t const strides[1] = {m.stride};
  cuuint32_t const box[2] = {m.box[0], m.box[1]};
  return encode_swizzled_map(map, base, 2, dims, strides, box);
}

cudaError_t encode_h_map(TensorMap& map, void const* h, int64_t num_slots, int HV) {
  HMapShape const m = h_map_shape(num_slots, HV);
  cuuint64_t const dims[3] = {m.dims[0], m.dims[1], m.dims[2]};
  cuuint64_t const strides[2] = {m.strides[0], m.strides[1]};
  cuuint32_t const box[3] = {m.box[0], m.box[1], m.box[2]};
  return encode_swizzled_map(map, h, 3, dims, strides, box);
}

}  // namespace cake::kernels
