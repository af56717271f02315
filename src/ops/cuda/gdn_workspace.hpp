// The one layout of the GDN GPU buffers: the same function sizes them (null bases) and carves the
// caller's memory into the intermediate tensors of forward and backward. It answers both arenas:
//   saved      the "saved set", what the backward reads of the forward's stages; the forward writes
//              it and the backward reads it: all of it in saved mode (options.save_for_backward
//              = 1), all but h in inverse mode (2): with use_qk_l2norm q̂, k̂ and their rows'
//              rstd (qk_norm), then kkt_solve's outputs (G, A, beta);
//   workspace  scratch memory of one call, dead when the call's work has run. What the mode does
//              not keep lives here (a forward writes q̂, k̂, rstd, G, A and beta there in recompute
//              mode, no h; the backward recomputes what is not kept).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/problem.hpp"
#include "ops/cuda/carver.hpp"

namespace cake::ops::cuda {

struct GdnBuffers {
  // the saved set (where each part lives: carve_gdn_buffers)
  __nv_bfloat16* q_norm = nullptr;  // [BT, H, K]   with use_qk_l2norm
  __nv_bfloat16* k_norm = nullptr;  // [BT, H, K]   with use_qk_l2norm
  float* q_rstd = nullptr;          // [BT, H]      with use_qk_l2norm: 1 / sqrt(sum q^2 + 1e-6)
  float* k_rstd = nullptr;          // [BT, H]      with use_qk_l2norm
  float* gcum = nullptr;            // [BT, HV]     G, within-chunk cumsum of g (kkt_solve)
  __nv_bfloat16* a = nullptr;       // [BT, HV, 64] A = (I + diag(beta) L)^-1 (kkt_solve)
  float* beta_f32 = nullptr;        // [BT, HV]     beta in fp32 (kkt_solve)
  __nv_bfloat16* h = nullptr;       // [num_slots, HV, K, V] chunk-start states (the forward walk
                                    //              in saved mode, the h-walk in the backward);
                                    //              absent in a forward that saves no h
  // workspace, backward only
  float* dq_sum = nullptr;     // [BT, H, K]   dq summed over the value heads (walk_a_bwd)
  float* dk_sum = nullptr;     // [BT, H, K]   dk summed over the value heads (walk_a_bwd)
  int* walk_order = nullptr;   // walk_a_bwd's tickets and turns (walk_a_bwd::Params::order;
                               //              zeroed before it), with group size > 1
  int* walk_done = nullptr;    // [N, HV]      the h-walk's flags, where the backward runs
                               //              it (not in saved mode): each reverse walk
                               //              waits on its own (walk_a_bwd::Params::h_ready)
  float* ds_end = nullptr;     // [num_slots, HV, K, V] the split reverse walk's dS of each
                               //              chunk's end (ReverseForm::kSplit only)
  size_t saved_bytes = 0;      // the saved arena (0 in recompute mode), without slack
  size_t workspace_bytes = 0;  // the workspace, including alignment slack for any base
};

// Carves `saved` (kSavedAlign-aligned) and `workspace` for problem p; null bases only count. In
// recompute mode the saved arena is empty and `saved` is ignored. `split`: the backward's reverse
// walk takes the split form (stages.hpp, reverse_form), whose dS buffer is in the workspace.
GdnBuffers carve_gdn_buffers(kernels::Problem const& p, bool use_qk_l2norm, Pass pass,
                             SaveMode mode, bool split, void* saved, void* workspace);

}  // namespace cake::ops::cuda
