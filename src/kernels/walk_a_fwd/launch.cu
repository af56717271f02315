#include <cuda.h>
#include <cudaTypedefs.h>

#include "kernels/walk_a_fwd/kernel.cuh"
#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/walk_a_fwd/roles.cuh"

namespace cake::kernels::walk_a_fwd {

namespace {

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) == alignof(CUtensorMap));

// A map of tile_map_shape(tokens, heads, cols) over the bf16 tensor at base, encoded by the
// driver's cuTensorMapEncodeTiled (through the runtime's entry point: no link to libcuda).
cudaError_t encode_tile_map(TensorMap& map, void const* base, int64_t tokens, int heads, int cols) {
  static PFN_cuTensorMapEncodeTiled_v12000 const encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  roles::TileMapShape const m = roles::tile_map_shape(tokens, heads, cols);
  cuuint64_t const dims[2] = {m.dims[0], m.dims[1]};
  cuuint64_t const strides[1] = {m.stride};
  cuuint32_t const box[2] = {m.box[0], m.box[1]};
  cuuint32_t const element_strides[2] = {1, 1};
  CUresult const r = encode(reinterpret_cast<CUtensorMap*>(&map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                            const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <class Kernel, class KernelParams>
cudaError_t launch_walk(Kernel kernel, int smem, int threads, KernelParams const& kernel_params,
                        Params const& params, cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // 1-D: walk_of_block maps each block to its (document, value head)
  dim3 const grid(
      static_cast<unsigned>(int64_t{params.problem.num_seqs} * params.problem.num_v_heads));
  kernel<<<grid, threads, smem, stream>>>(kernel_params);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch(Params const& params, cudaStream_t stream) {
  // The flags are the h-walk's alone (params.hpp)
  if (params.walk_done != nullptr && params.o != nullptr) return cudaErrorInvalidValue;
  // o without h (recompute mode's forward): the warpgroup-role walk (roles.cuh says why only
  // there); saved mode's forward (o and h) and the h-walk (o == nullptr): kernel.cuh's.
  if (params.o != nullptr && params.h == nullptr) {
    Problem const& pr = params.problem;
    roles::RolesParams rp{params, {}, {}, {}, {}};
    for (cudaError_t err :
         {encode_tile_map(rp.q_map, params.q, pr.num_tokens, pr.num_qk_heads, kHeadDim),
          encode_tile_map(rp.k_map, params.k, pr.num_tokens, pr.num_qk_heads, kHeadDim),
          encode_tile_map(rp.v_map, params.v, pr.num_tokens, pr.num_v_heads, kHeadDim),
          encode_tile_map(rp.a_map, params.a, pr.num_tokens, pr.num_v_heads, kChunk)})
      if (err != cudaSuccess) return err;
    return launch_walk(roles::walk_a_fwd_roles_kernel, sizeof(roles::SharedStorage),
                       roles::kThreads, rp, params, stream);
  }
  auto const kernel =
      params.o == nullptr ? walk_a_fwd_kernel<false> : walk_a_fwd_kernel<true>;
  return launch_walk(kernel, sizeof(SharedStorage), kThreads, params, params, stream);
}

}  // namespace cake::kernels::walk_a_fwd
