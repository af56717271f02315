#include "ops/cuda/gdn_workspace.hpp"

#include <cstdint>

#include "kernels/walk_a_bwd/params.hpp"

namespace cake::ops::cuda {

GdnBuffers carve_gdn_buffers(kernels::Problem const& p, bool use_qk_l2norm, Pass pass,
                             SaveMode mode, bool split, void* saved, void* workspace) {
  using kernels::kChunk;
  using kernels::kHeadDim;
  using bf16 = __nv_bfloat16;
  bool const kept = mode != SaveMode::kRecompute;  // the saved arena holds something
  Carver saved_arena(kept ? saved : nullptr, Carver::kFixed);
  Carver scratch(workspace, Carver::kRelocatable);
  // Where each part of the saved set lives: q̂, k̂ with their rstd (qk_norm) and kkt_solve's
  // outputs (G, A, beta) in the saved arena in saved and inverse modes, h there in saved mode
  // only; else in the workspace.
  Carver& solved = kept ? saved_arena : scratch;
  Carver& h_arena = mode == SaveMode::kSaved ? saved_arena : scratch;
  bool const backward = pass == Pass::kBackward;
  GdnBuffers b;
  int64_t const bt = p.num_tokens;
  int64_t const qk_rows = bt * p.num_qk_heads;
  int64_t const v_rows = bt * p.num_v_heads;
  int64_t const states = p.chunk_state_elements();

  // The saved set, in one order for forward and backward: both carve the same offsets.
  if (use_qk_l2norm) {
    b.q_norm = solved.take<bf16>(qk_rows * kHeadDim);
    b.k_norm = solved.take<bf16>(qk_rows * kHeadDim);
    b.q_rstd = solved.take<float>(qk_rows);
    b.k_rstd = solved.take<float>(qk_rows);
  }
  b.gcum = solved.take<float>(v_rows);
  b.a = solved.take<bf16>(v_rows * kChunk);
  b.beta_f32 = solved.take<float>(v_rows);
  // A forward that saves no h needs none (its walk keeps the state on chip).
  if (backward || mode == SaveMode::kSaved) b.h = h_arena.take<bf16>(states);

  if (backward) {
    b.dq_sum = scratch.take<float>(qk_rows * kHeadDim);
    b.dk_sum = scratch.take<float>(qk_rows * kHeadDim);
    if (p.group_size() > 1)
      b.walk_order = scratch.take<int>(kernels::walk_a_bwd::walk_order_size(p));
    if (mode != SaveMode::kSaved)
      b.walk_done = scratch.take<int>(int64_t{p.num_seqs} * p.num_v_heads);
    if (split) b.ds_end = scratch.take<float>(states);
  }
  b.saved_bytes = kept ? saved_arena.bytes() : 0;
  b.workspace_bytes = scratch.bytes();
  return b;
}

}  // namespace cake::ops::cuda
