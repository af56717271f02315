#include "kernels/common/device_sms.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/walk_a_fwd/maps.hpp"
#include "kernels/walk_a_fwd/roles.cuh"
#include "kernels/walk_a_fwd/split.hpp"

namespace cake::kernels::walk_a_fwd {

template <class Decay>
cudaError_t launch(Params const& params, cudaStream_t stream) {
  // The flags are the h-walk's alone, and the h-walk is its h (params.hpp)
  if (params.walk_done != nullptr && params.o != nullptr) return cudaErrorInvalidValue;
  if (params.o == nullptr && params.h == nullptr) return cudaErrorInvalidValue;
  Problem const& pr = params.problem;
  roles::RolesParams rp{params, {}, {}, {}, {}, {}, {}, {}};
  if (cudaError_t const err = encode_maps<Decay>(rp); err != cudaSuccess) return err;
  // The SMs of the current device (an attribute: no sync), for split.hpp's rule
  int num_sms = 0;
  if (cudaError_t const err = current_sm_count(&num_sms); err != cudaSuccess) return err;
  int64_t const num_walks = int64_t{pr.num_seqs} * pr.num_v_heads;
  bool const split = split_walks(num_walks, num_sms);
  bool const with_o = params.o != nullptr;
  auto const kernel = split ? (with_o ? roles::walk_a_fwd_roles_kernel<Decay, true, kSlicesOfH>
                                      : roles::walk_a_fwd_roles_kernel<Decay, false, kSlicesOfH>)
                            : (with_o ? roles::walk_a_fwd_roles_kernel<Decay, true, 1>
                                      : roles::walk_a_fwd_roles_kernel<Decay, false, 1>);
  int const smem = sizeof(roles::SharedStorage<Decay>);
  cudaError_t const err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // 1-D: walk_slice_of_block maps each block to its (document, value head) and columns
  dim3 const grid(static_cast<unsigned>(num_walks * (split ? kSlicesOfH : 1)));
  kernel<<<grid, roles::kThreads, smem, stream>>>(rp);
  return cudaGetLastError();
}

template cudaError_t launch<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch<ChannelDecay>(Params const&, cudaStream_t);

}  // namespace cake::kernels::walk_a_fwd
