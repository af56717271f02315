#include <cuda.h>
#include <cudaTypedefs.h>

#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/walk_a_fwd/roles.cuh"

namespace cake::kernels::walk_a_fwd {

namespace {

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) &&
              alignof(TensorMap) == alignof(CUtensorMap));

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

// A map of tile_map_shape(tokens, heads, cols) over the bf16 tensor at base.
cudaError_t encode_tile_map(TensorMap& map, void const* base, int64_t tokens, int heads, int cols) {
  roles::TileMapShape const m = roles::tile_map_shape(tokens, heads, cols);
  cuuint64_t const dims[2] = {m.dims[0], m.dims[1]};
  cuuint64_t const strides[1] = {m.stride};
  cuuint32_t const box[2] = {m.box[0], m.box[1]};
  return encode_swizzled_map(map, base, 2, dims, strides, box);
}

// The map of h_map_shape(num_slots, HV) over h (bf16 [num_slots, HV, 128, 128]).
cudaError_t encode_h_map(TensorMap& map, void* h, int64_t num_slots, int HV) {
  roles::HMapShape const m = roles::h_map_shape(num_slots, HV);
  cuuint64_t const dims[3] = {m.dims[0], m.dims[1], m.dims[2]};
  cuuint64_t const strides[2] = {m.strides[0], m.strides[1]};
  cuuint32_t const box[3] = {m.box[0], m.box[1], m.box[2]};
  return encode_swizzled_map(map, h, 3, dims, strides, box);
}

}  // namespace

cudaError_t launch(Params const& params, cudaStream_t stream) {
  // The flags are the h-walk's alone, and the h-walk is its h (params.hpp)
  if (params.walk_done != nullptr && params.o != nullptr) return cudaErrorInvalidValue;
  if (params.o == nullptr && params.h == nullptr) return cudaErrorInvalidValue;
  Problem const& pr = params.problem;
  // TMA coordinates are int32 (a box's first token; a state, slot x HV + hv): an out-of-range box
  // would be dropped (a store) or read as zeros (a load) without an error. Memory makes such
  // problems unreachable (2^31 tokens of one bf16 [HV, 128] tensor is 0.5 TB per head).
  if (pr.num_tokens > INT32_MAX - kChunk || pr.num_slots * pr.num_v_heads > INT32_MAX)
    return cudaErrorInvalidValue;
  roles::RolesParams rp{params, {}, {}, {}, {}, {}};
  for (cudaError_t err :
       {encode_tile_map(rp.q_map, params.q, pr.num_tokens, pr.num_qk_heads, kHeadDim),
        encode_tile_map(rp.k_map, params.k, pr.num_tokens, pr.num_qk_heads, kHeadDim),
        encode_tile_map(rp.v_map, params.v, pr.num_tokens, pr.num_v_heads, kHeadDim),
        encode_tile_map(rp.a_map, params.a, pr.num_tokens, pr.num_v_heads, kChunk),
        params.h != nullptr ? encode_h_map(rp.h_map, params.h, pr.num_slots, pr.num_v_heads)
                            : cudaSuccess})
    if (err != cudaSuccess) return err;
  auto const kernel = params.o != nullptr ? roles::walk_a_fwd_roles_kernel<true>
                                          : roles::walk_a_fwd_roles_kernel<false>;
  int const smem = sizeof(roles::SharedStorage);
  cudaError_t const err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // 1-D: walk_of_block maps each block to its (document, value head)
  dim3 const grid(static_cast<unsigned>(int64_t{pr.num_seqs} * pr.num_v_heads));
  kernel<<<grid, roles::kThreads, smem, stream>>>(rp);
  return cudaGetLastError();
}

}  // namespace cake::kernels::walk_a_fwd
