#include "kernels/walk_a_fwd/kernel.cuh"
#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/walk_a_fwd/roles.cuh"

namespace cake::kernels::walk_a_fwd {

namespace {

template <class Kernel>
cudaError_t launch_walk(Kernel kernel, int smem, int threads, Params const& params,
                        cudaStream_t stream) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // 1-D: walk_of_block maps each block to its (document, value head)
  dim3 const grid(
      static_cast<unsigned>(int64_t{params.problem.num_seqs} * params.problem.num_v_heads));
  kernel<<<grid, threads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch(Params const& params, cudaStream_t stream) {
  // The flags are the h-walk's alone (params.hpp)
  if (params.walk_done != nullptr && params.o != nullptr) return cudaErrorInvalidValue;
  // o without h (recompute mode's forward): the warpgroup-role walk (roles.cuh says why only
  // there); saved mode's forward (o and h) and the h-walk (o == nullptr): kernel.cuh's.
  if (params.o != nullptr && params.h == nullptr)
    return launch_walk(roles::walk_a_fwd_roles_kernel, sizeof(roles::SharedStorage),
                       roles::kThreads, params, stream);
  auto const kernel =
      params.o == nullptr ? walk_a_fwd_kernel<false> : walk_a_fwd_kernel<true>;
  return launch_walk(kernel, sizeof(SharedStorage), kThreads, params, stream);
}

}  // namespace cake::kernels::walk_a_fwd
