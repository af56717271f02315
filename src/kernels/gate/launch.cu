#include "kernels/gate/kernel.cuh"
#include "kernels/gate/launch.hpp"

namespace cake::kernels::gate {

cudaError_t launch_forward(Params const& p, cudaStream_t stream) {
  if (p.num_tokens == 0 || p.num_v_heads == 0) return cudaSuccess;
  if (p.activate_g) {
    gate_fwd_kernel<<<flat_grid(p.num_tokens * p.num_v_heads * p.width), kThreads, 0, stream>>>(p);
  }
  if (p.activate_beta) {
    beta_fwd_kernel<<<flat_grid(p.num_tokens * p.num_v_heads), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t launch_backward(Params const& p, cudaStream_t stream) {
  if (p.num_v_heads == 0) return cudaSuccess;
  int const slots = p.num_v_heads * p.width;
  if (p.num_tokens > 0 && wants_gate_bwd(p)) {
    Grid const g = tile_grid(slots, p.num_tokens);
    gate_bwd_kernel<<<dim3(g.x, g.y), kThreads, 0, stream>>>(p);
  }
  // With no tokens the sums are zero: the reduction still writes them.
  if (wants_reduce(p)) {
    gate_reduce_kernel<<<reduce_blocks(slots), kReduceThreads, sizeof(ReduceShared), stream>>>(p);
    if (p.dA_log != nullptr) gate_head_kernel<<<blocks(p.num_v_heads), kThreads, 0, stream>>>(p);
  }
  if (p.num_tokens > 0 && wants_beta_bwd(p)) {
    beta_bwd_kernel<<<flat_grid(p.num_tokens * p.num_v_heads), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace cake::kernels::gate
