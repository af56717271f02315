#include "ops/cuda/kda_workspace.hpp"

#include <cstdint>

namespace cake::ops::cuda {

KdaBuffers carve_kda_buffers(kernels::Problem const& p, bool use_qk_l2norm, Pass pass,
                             SaveMode mode, bool split, void* saved, void* workspace) {
  using kernels::kChunk;
  using kernels::kHeadDim;
  using bf16 = __nv_bfloat16;
  // saved mode keeps the whole set; inverse mode the chunk pass's products (G's last rows, A,
  // beta, P), which the backward would otherwise form again from the gated K K^T and Q K^T
  bool const kept = mode == SaveMode::kSaved;
  bool const products_kept = kept || mode == SaveMode::kInverse;
  Carver saved_arena(products_kept ? saved : nullptr, Carver::kFixed);
  Carver scratch(workspace, Carver::kRelocatable);
  Carver& set = kept ? saved_arena : scratch;
  Carver& products = products_kept ? saved_arena : scratch;
  bool const backward = pass == Pass::kBackward;
  KdaBuffers b;
  int64_t const qk_rows = p.num_tokens * p.num_qk_heads;
  int64_t const v_rows = p.num_tokens * p.num_v_heads;
  int64_t const slot_rows = p.num_slots * p.num_v_heads;

  // The saved set, in one order for forward and backward: both carve the same offsets.
  if (use_qk_l2norm) {
    b.q_norm = set.take<bf16>(qk_rows * kHeadDim);
    b.k_norm = set.take<bf16>(qk_rows * kHeadDim);
    b.q_rstd = set.take<float>(qk_rows);
    b.k_rstd = set.take<float>(qk_rows);
  }
  b.glast = products.take<float>(slot_rows * kHeadDim);
  b.a = products.take<bf16>(v_rows * kChunk);
  b.beta_f32 = products.take<float>(v_rows);
  b.aqk = products.take<bf16>(v_rows * kChunk);
  b.qg = set.take<bf16>(v_rows * kHeadDim);
  b.kg = set.take<bf16>(v_rows * kHeadDim);
  b.kbar = set.take<bf16>(v_rows * kHeadDim);
  if (backward || kept) b.h = set.take<bf16>(p.chunk_state_elements());

  if (backward) {
    b.dqk = scratch.take<float>(v_rows * kChunk);
    b.dl = scratch.take<float>(v_rows * kChunk);
    b.dqg = scratch.take<float>(v_rows * kHeadDim);
    b.dkg = scratch.take<float>(v_rows * kHeadDim);
    b.dkbar = scratch.take<float>(v_rows * kHeadDim);
    b.dgamma = scratch.take<float>(slot_rows * kHeadDim);
    b.dbeta_walk = scratch.take<float>(v_rows);
    if (p.group_size() > 1) {  // intra_bwd's sums before the last value head
      b.dq_sum = scratch.take<float>(qk_rows * kHeadDim);
      b.dk_sum = scratch.take<float>(qk_rows * kHeadDim);
    }
    if (!kept) b.walk_done = scratch.take<int>(int64_t{p.num_seqs} * p.num_v_heads);
    if (split) b.ds_end = scratch.take<float>(p.chunk_state_elements());
  }
  b.saved_bytes = products_kept ? saved_arena.bytes() : 0;
  b.workspace_bytes = scratch.bytes();
  return b;
}

}  // namespace cake::ops::cuda
