#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/walk_a_fwd/maps.hpp"
#include "kernels/walk_a_fwd/roles.cuh"

namespace cake::kernels::walk_a_fwd {

template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream) {
  // The flags are the h-walk's alone, and the h-walk is its h (params.hpp)
  if (params.walk_done != nullptr && params.o != nullptr) return cudaErrorInvalidValue;
  if (params.o == nullptr && params.h == nullptr) return cudaErrorInvalidValue;
  Problem const& pr = params.problem;
  roles::RolesParams rp{params, {}, {}, {}, {}, {}, {}, {}};
  if (cudaError_t const err = encode_maps<Decay>(rp); err != cudaSuccess) return err;
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
