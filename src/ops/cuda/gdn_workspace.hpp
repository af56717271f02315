// The one layout of the GDN GPU buffers: the same function sizes them (null bases) and carves the
// caller's memory into the intermediate tensors of forward and backward. It answers both arenas:
//   saved      the "saved set", what the backward reads of the forward's stages; the forward writes
//              it and the backward reads it in saved mode (options.save_for_backward = 1);
//   workspace  scratch memory of one call, dead when the call's work has run. In recompute mode
//              the saved set lives here too (the recompute-mode forward writes only q̂, k̂ and G
//              of it; the backward recomputes all of it).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/problem.hpp"

namespace cake::ops::cuda {

// The saved arena starts at its base, which must be this aligned (so that the saved set does not
// depend on its address); the workspace may start anywhere (its size includes the slack).
inline constexpr size_t kSavedAlign = 256;

enum class Pass { kForward, kBackward };

struct GdnBuffers {
  // the saved set: saved arena in saved mode, workspace in recompute mode
  __nv_bfloat16* q_norm = nullptr;  // [BT, H, K]   with use_qk_l2norm
  __nv_bfloat16* k_norm = nullptr;  // [BT, H, K]   with use_qk_l2norm
  float* gcum = nullptr;            // [BT, HV]     G, within-chunk cumsum of g
  __nv_bfloat16* w = nullptr;       // [BT, HV, K]  W (read by state_bwd); this and the three
                                    //              below are absent in a recompute-mode forward
                                    //              (its walk works from A)
  __nv_bfloat16* v_new = nullptr;   // [BT, HV, V]  Delta = U - W h
  __nv_bfloat16* h = nullptr;       // [num_slots, HV, K, V] chunk-start states
  float* tmat = nullptr;            // [BT, HV, 64] T = (I + L)^-1 rows
  // workspace
  __nv_bfloat16* a = nullptr;       // [BT, HV, 64] A = (I + diag(beta) L)^-1 (kkt_solve), forward
  float* beta_f32 = nullptr;        // [BT, HV]     beta in fp32 for the walk, forward
  __nv_bfloat16* u = nullptr;       // [BT, HV, V]  U, read by state_fwd: saved-mode forward and
                                    //              recompute-mode backward
  __nv_bfloat16* dw = nullptr;      // [BT, HV, K]  dW, backward only: aliases w in recompute mode
                                    //              (W is dead after state_bwd); its own region in
                                    //              saved mode (the saved set is read only)
  float* dv_new = nullptr;          // [BT, HV, V]  dDelta (first its intra-chunk part)
  __nv_bfloat16* dh = nullptr;      // [num_slots, HV, K, V] gradients of chunk-end states
  float* dq_h = nullptr;            // [BT, H, K]   dq, summed over the value heads (dqk_bwd)
  float* dk_h = nullptr;            // [BT, H, K]   dk's output/state terms, likewise (dqk_bwd)
  float* dk_wy_hv = nullptr;        // [BT, HV, K]  dk's WY terms per value head (wy_bwd)
  float* dg_part = nullptr;         // [BT, HV]     dG from the output and state terms
  size_t saved_bytes = 0;           // the saved arena (0 in recompute mode), without slack
  size_t workspace_bytes = 0;       // the workspace, including alignment slack for any base
};

// Carves `saved` (kSavedAlign-aligned) and `workspace` for problem p; null bases only count. In
// recompute mode (saved_mode false) the saved arena is empty and `saved` is ignored.
GdnBuffers carve_gdn_buffers(kernels::Problem const& p, bool use_qk_l2norm, Pass pass,
                             bool saved_mode, void* saved, void* workspace);

}  // namespace cake::ops::cuda
