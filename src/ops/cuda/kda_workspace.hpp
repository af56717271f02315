// The one layout of the KDA GPU buffers (as gdn_workspace.hpp for GDN): the same function sizes
// them (null bases) and carves the caller's memory. Saved mode (options.save_for_backward = 1)
// keeps the whole saved set: the backward reruns nothing before the reverse walk. Inverse mode
// (2) keeps the chunk pass's products, G's last rows, A, beta and P (~0.26 KB per token and value
// head): the backward forms the walks' operands qg, kg, kbar again (elementwise, from q, k and g)
// and the h-walk, but not the gated K K^T, its solve or P, the costly part of the chunk pass.
// Recompute mode (0) keeps nothing.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "kernels/common/problem.hpp"
#include "ops/cuda/carver.hpp"

namespace cake::ops::cuda {

struct KdaBuffers {
  // the saved set (in saved mode; glast, a, beta_f32 and aqk also in inverse mode; else in the
  // workspace)
  __nv_bfloat16* q_norm = nullptr;  // [BT, H, K]      with use_qk_l2norm
  __nv_bfloat16* k_norm = nullptr;  // [BT, H, K]      with use_qk_l2norm
  float* q_rstd = nullptr;          // [BT, H]         with use_qk_l2norm: 1 / sqrt(sum q^2 + 1e-6)
  float* k_rstd = nullptr;          // [BT, H]         with use_qk_l2norm (qk_grad's norm backward)
  float* glast = nullptr;           // [num_slots, HV, K] G of each chunk's last token (kkt_solve)
  __nv_bfloat16* a = nullptr;       // [BT, HV, 64]    the gated T (kkt_solve)
  float* beta_f32 = nullptr;        // [BT, HV]        beta in fp32 (kkt_solve)
  __nv_bfloat16* aqk = nullptr;     // [BT, HV, 64]    P (kkt_solve)
  __nv_bfloat16* qg = nullptr;      // [BT, HV, K]     q o e^G (kkt_solve)
  __nv_bfloat16* kg = nullptr;      // [BT, HV, K]     k o e^G (kkt_solve)
  __nv_bfloat16* kbar = nullptr;    // [BT, HV, K]     k o e^{G_last - G} (kkt_solve)
  __nv_bfloat16* h = nullptr;       // [num_slots, HV, K, V] chunk-start states; absent in a
                                    //                 forward that saves no h
  // workspace, backward only: the reverse walk's hand-over to the intra pass, and its sums
  float* dqk = nullptr;         // [BT, HV, 64]    s mask(dO Delta^T)
  float* dl = nullptr;          // [BT, HV, 64]    dL
  float* dqg = nullptr;         // [BT, HV, K]
  float* dkg = nullptr;         // [BT, HV, K]
  float* dkbar = nullptr;       // [BT, HV, K]
  float* dgamma = nullptr;      // [num_slots, HV, K]
  float* dbeta_walk = nullptr;  // [BT, HV]
  float* dq_sum = nullptr;      // [BT, H, K]      dq summed over the value heads before the
  float* dk_sum = nullptr;      // [BT, H, K]      last, dk (intra_bwd; group_size > 1 only)
  int* walk_done = nullptr;     // [N, HV]         the h-walk's flags (not in saved mode)
  float* ds_end = nullptr;      // [num_slots, HV, K, V] the split reverse walk's dS of each
                                //                 chunk's end (ReverseForm::kSplit only)
  size_t saved_bytes = 0;       // the saved arena (0 in recompute mode), without slack
  size_t workspace_bytes = 0;   // the workspace, including alignment slack for any base
};

// Carves `saved` (kSavedAlign-aligned; ignored in recompute mode) and `workspace` for problem p;
// null bases only count. `split`: the backward's reverse walk takes the split form (stages.hpp,
// reverse_form), whose dS buffer is in the workspace.
KdaBuffers carve_kda_buffers(kernels::Problem const& p, bool use_qk_l2norm, Pass pass,
                             SaveMode mode, bool split, void* saved, void* workspace);

}  // namespace cake::ops::cuda
