#include "kernels/common/tensor_map_encode.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/walk_a_fwd/roles.cuh"

namespace cake::kernels::walk_a_fwd {

template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream) {
  // The flags are the h-walk's alone, and the h-walk is its h (params.hpp)
  if (params.walk_done != nullptr && params.o != nullptr) return cudaErrorInvalidValue;
  if (params.o == nullptr && params.h == nullptr) return cudaErrorInvalidValue;
  Problem const& pr = params.problem;
  if (!tma_coordinates_fit(pr.num_tokens, pr.num_slots, pr.num_v_heads))
    return cudaErrorInvalidValue;
  roles::RolesParams rp{params, {}, {}, {}, {}, {}, {}, {}};
  // ChannelDecay: qg, kg [BT, HV, 128] in Q's and K's places
  bool const channel = Decay::kGatedKkt;
  int const qk_heads = channel ? pr.num_v_heads : pr.num_qk_heads;
  for (cudaError_t err :
       {encode_tile_map(rp.q_map, channel ? params.qg : params.q, pr.num_tokens, qk_heads,
                        kHeadDim),
        encode_tile_map(rp.k_map, channel ? params.kg : params.k, pr.num_tokens, qk_heads,
                        kHeadDim),
        encode_tile_map(rp.v_map, params.v, pr.num_tokens, pr.num_v_heads, kHeadDim),
        channel ? encode_tile_map(rp.kbar_map, params.kbar, pr.num_tokens, pr.num_v_heads, kHeadDim)
                : cudaSuccess,
        channel && params.o != nullptr
            ? encode_tile_map(rp.aqk_map, params.aqk, pr.num_tokens, pr.num_v_heads, kChunk)
            : cudaSuccess,
        encode_tile_map(rp.a_map, params.a, pr.num_tokens, pr.num_v_heads, kChunk),
        params.h != nullptr ? encode_h_map(rp.h_map, params.h, pr.num_slots, pr.num_v_heads)
                            : cudaSuccess})
    if (err != cudaSuccess) return err;
  auto const kernel = params.o != nullptr ? roles::walk_a_fwd_roles_kernel<Decay, true>
                                          : roles::walk_a_fwd_roles_kernel<Decay, false>;
  int const smem = sizeof(roles::SharedStorage<Decay>);
  cudaError_t const err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // 1-D: walk_of_block maps each block to its (document, value head)
  dim3 const grid(static_cast<unsigned>(int64_t{pr.num_seqs} * pr.num_v_heads));
  kernel<<<grid, roles::kThreads, smem, stream>>>(rp);
  return cudaGetLastError();
}

template cudaError_t launch<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch<ChannelDecay>(Params const&, cudaStream_t);

}  // namespace cake::kernels::walk_a_fwd
