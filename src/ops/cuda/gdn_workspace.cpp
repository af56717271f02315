#include "ops/cuda/gdn_workspace.hpp"

#include <cstdint>

namespace cake::ops::cuda {

namespace {

constexpr size_t kAlign = 256;
static_assert(kSavedAlign == kAlign, "saved regions are aligned as workspace regions");

// Hands out 256-byte-aligned regions one after another from base (or from 0 when counting).
// Relocatable (the workspace): the caller's base need not be aligned; the carver starts at the
// first aligned byte, and the size it reports includes that slack, so the same bytes suffice for
// any base. Fixed (the saved set): the base is aligned (the caller checks), so offsets from the
// base, and hence the saved set's contents, are the same wherever it lies; no slack.
class Carver {
 public:
  enum Base { kRelocatable, kFixed };

  Carver(void* base, Base kind) : base_(static_cast<char*>(base)), slack_(kind == kRelocatable) {
    if (base_ != nullptr && slack_) {
      auto const addr = reinterpret_cast<uintptr_t>(base_);
      base_ += (kAlign - addr % kAlign) % kAlign;
    }
  }

  template <class T>
  T* take(int64_t count) {
    offset_ = (offset_ + kAlign - 1) / kAlign * kAlign;
    T* ptr = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += static_cast<size_t>(count) * sizeof(T);
    return ptr;
  }
  size_t bytes() const { return offset_ + (slack_ ? kAlign : 0); }

 private:
  char* base_;
  bool slack_;
  size_t offset_ = 0;
};

}  // namespace

GdnBuffers carve_gdn_buffers(kernels::Problem const& p, bool use_qk_l2norm, Pass pass,
                             SaveMode mode, void* saved, void* workspace) {
  using kernels::kChunk;
  using kernels::kHeadDim;
  using bf16 = __nv_bfloat16;
  bool const kept = mode != SaveMode::kRecompute;  // the saved arena holds something
  Carver saved_arena(kept ? saved : nullptr, Carver::kFixed);
  Carver scratch(workspace, Carver::kRelocatable);
  // Where each part of the saved set lives: kkt_solve's outputs (G, A, beta) in the saved arena in
  // saved and inverse modes, the rest (q̂, k̂, h) there in saved mode only; else in the workspace.
  Carver& solved = kept ? saved_arena : scratch;
  Carver& rest = mode == SaveMode::kSaved ? saved_arena : scratch;
  bool const backward = pass == Pass::kBackward;
  GdnBuffers b;
  int64_t const bt = p.num_tokens;
  int64_t const qk_rows = bt * p.num_qk_heads;
  int64_t const v_rows = bt * p.num_v_heads;
  int64_t const states = p.num_slots * p.num_v_heads * kHeadDim * kHeadDim;

  // The saved set, in one order for forward and backward: both carve the same offsets.
  if (use_qk_l2norm) {
    b.q_norm = rest.take<bf16>(qk_rows * kHeadDim);
    b.k_norm = rest.take<bf16>(qk_rows * kHeadDim);
  }
  b.gcum = solved.take<float>(v_rows);
  b.a = solved.take<bf16>(v_rows * kChunk);
  b.beta_f32 = solved.take<float>(v_rows);
  // A forward that saves no h needs none (its walk keeps the state on chip).
  if (backward || mode == SaveMode::kSaved) b.h = rest.take<bf16>(states);

  if (backward) {
    b.dq_hv = scratch.take<float>(v_rows * kHeadDim);
    b.dk_hv = scratch.take<float>(v_rows * kHeadDim);
    if (mode != SaveMode::kSaved)
      b.walk_done = scratch.take<int>(int64_t{p.num_seqs} * p.num_v_heads);
  }
  b.saved_bytes = kept ? saved_arena.bytes() : 0;
  b.workspace_bytes = scratch.bytes();
  return b;
}

}  // namespace cake::ops::cuda
