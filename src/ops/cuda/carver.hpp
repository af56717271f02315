// The two arenas of a GPU op's buffers and how they are carved: one arena of device memory cut
// into 256-byte-aligned regions, one after another, by the same calls that size it (with a null
// base). Shared by the GDN and KDA layouts (gdn_workspace.cpp, kda_workspace.cpp): each is one
// function that answers both "how many bytes?" and "where does each buffer live?".
#pragma once

#include <cstddef>
#include <cstdint>

namespace cake::ops::cuda {

// The saved arena starts at its base, which must be this aligned (so that the saved set does not
// depend on its address); the workspace may start anywhere (its size includes the slack).
inline constexpr size_t kSavedAlign = 256;

enum class Pass { kForward, kBackward };
// options.save_for_backward's modes (include/cake/cake.h)
enum class SaveMode { kRecompute = 0, kSaved = 1, kInverse = 2 };

inline constexpr size_t kAlign = 256;
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

}  // namespace cake::ops::cuda
