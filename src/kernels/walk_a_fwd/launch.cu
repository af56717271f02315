#include "kernels/walk_a_fwd/kernel.cuh"
#include "kernels/walk_a_fwd/launch.hpp"

namespace cake::kernels::walk_a_fwd {

cudaError_t launch(Params const& params, cudaStream_t stream) {
  int const smem = sizeof(SharedStorage);
  // o == nullptr: the h-walk (kernel.cuh)
  auto const kernel = params.o == nullptr   ? walk_a_fwd_kernel<false, true>
                      : params.h != nullptr ? walk_a_fwd_kernel<true, true>
                                            : walk_a_fwd_kernel<true, false>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  // 1-D: walk_of_block maps each block to its (document, value head)
  dim3 const grid(
      static_cast<unsigned>(int64_t{params.problem.num_seqs} * params.problem.num_v_heads));
  kernel<<<grid, kThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace cake::kernels::walk_a_fwd
