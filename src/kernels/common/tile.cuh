// Block-wide copies of chunk tiles between global and shared memory. Rows at or past `valid`
// (the tail of a partial chunk) are zero-filled, so that every product over the chunk sees zeros
// there and no stage needs a per-element length test inside its reductions.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace cake::kernels {

// Padded leading dimensions: a 136-bf16 (272-byte) row starts 16 bytes (4 banks) after the
// previous one, so the 8 row addresses of an ldmatrix phase fall in distinct banks; 68-float rows
// do the same for fp32 64x64 tiles.
inline constexpr int kLdBf16 = 136;
inline constexpr int kLd64 = 68;

// dst[r][c] = src[r * row_stride + c] for r < kRows, c < kCols, for bf16 or fp32 tiles, in
// 16-byte cp.async copies, all in flight at once. Asynchronous: the caller waits (cp_async_wait)
// and then syncs the block.
template <int kRows, int kCols, int kThreads, class T>
__device__ __forceinline__ void load_tile_async(T* dst, int ld, T const* src, int64_t row_stride,
                                                int valid) {
  constexpr int kPerVec = 16 / sizeof(T);
  static_assert(kCols % kPerVec == 0, "tiles are copied in 16-byte vectors");
  constexpr int kVecs = kCols / kPerVec;
  static_assert(kRows * kVecs % kThreads == 0, "the tile must split evenly over the threads");
#pragma unroll
  for (int it = 0; it < kRows * kVecs / kThreads; ++it) {
    int const idx = it * kThreads + threadIdx.x;
    int const r = idx / kVecs;
    int const c = (idx % kVecs) * kPerVec;
    bool const ok = r < valid;
    cp_async_16(dst + r * ld + c, src + (ok ? r * row_stride + c : 0), ok);
  }
}

// A per-token scalar (beta) stored as fp32 or bf16.
__device__ __forceinline__ float load_scalar(void const* p, int64_t i, bool is_bf16) {
  return is_bf16 ? __bfloat162float(static_cast<__nv_bfloat16 const*>(p)[i])
                 : static_cast<float const*>(p)[i];
}

// Inclusive prefix sum of x[0..63] in place, by warp 0 (the others return at once).
__device__ __forceinline__ void warp_cumsum64(float* x) {
  if (threadIdx.x >= 32) return;
  int const lane = threadIdx.x;
  float lo = x[lane];
  float hi = x[lane + 32];
  for (int d = 1; d < 32; d *= 2) {
    float const a = __shfl_up_sync(0xffffffffu, lo, d);
    float const b = __shfl_up_sync(0xffffffffu, hi, d);
    if (lane >= d) {
      lo += a;
      hi += b;
    }
  }
  hi += __shfl_sync(0xffffffffu, lo, 31);
  x[lane] = lo;
  x[lane + 32] = hi;
}

}  // namespace cake::kernels
