#include "ops/cuda/gdn_workspace.hpp"

#include <cstdint>

namespace cake::ops::cuda {

namespace {

constexpr size_t kAlign = 256;

// Hands out 256-byte-aligned regions one after another from base (or from 0 when counting). The
// caller's base need not be aligned: the carver starts at the first aligned byte, and the size it
// reports includes that slack, so the same bytes suffice for any base.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {
    if (base_ != nullptr) {
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
  size_t bytes() const { return offset_ + kAlign; }

 private:
  char* base_;
  size_t offset_ = 0;
};

}  // namespace

GdnBuffers carve_gdn_workspace(kernels::Problem const& p, bool use_qk_l2norm, bool backward,
                               void* base) {
  using kernels::kChunk;
  using kernels::kHeadDim;
  Carver carver(base);
  GdnBuffers b;
  int64_t const bt = p.num_tokens;
  int64_t const qk_rows = bt * p.num_qk_heads;
  int64_t const v_rows = bt * p.num_v_heads;
  int64_t const states = p.num_slots * p.num_v_heads * kHeadDim * kHeadDim;
  if (use_qk_l2norm) {
    b.q_norm = carver.take<__nv_bfloat16>(qk_rows * kHeadDim);
    b.k_norm = carver.take<__nv_bfloat16>(qk_rows * kHeadDim);
  }
  b.gcum = carver.take<float>(v_rows);
  b.w = carver.take<__nv_bfloat16>(v_rows * kHeadDim);
  b.u = carver.take<__nv_bfloat16>(v_rows * kHeadDim);
  b.v_new = carver.take<__nv_bfloat16>(v_rows * kHeadDim);
  b.h = carver.take<__nv_bfloat16>(states);
  if (backward) {
    b.tmat = carver.take<float>(v_rows * kChunk);
    b.dv_new = carver.take<float>(v_rows * kHeadDim);
    b.dh = carver.take<__nv_bfloat16>(states);
    b.dq_hv = carver.take<float>(v_rows * kHeadDim);
    b.dk_hv = carver.take<float>(v_rows * kHeadDim);
    b.dg_part = carver.take<float>(v_rows);
  }
  b.bytes = carver.bytes();
  return b;
}

}  // namespace cake::ops::cuda
