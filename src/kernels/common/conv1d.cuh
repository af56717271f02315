// Device building blocks of the conv kernels (conv1d_fwd, conv1d_bwd): the documents of a pack,
// element loads and stores in the tensors' dtypes with FP32 arithmetic, and SiLU.
//
// Token-major tensors (x, residual, y, dy, dx) have a compile-time dtype T and are read V
// channels at a time (each stage's channels_per_thread): one V * sizeof(T)-byte load when
// `vectorised` (D a multiple of V, aligned bases), else element by element with the channels
// past D read as 0 and not written. The small
// tensors (weight, bias, the states and their gradients) have a runtime dtype: they are read once
// per thread and block, so a switch costs nothing there and saves compiled variants.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

#include "cake/cake.h"
#include "kernels/common/dtype.cuh"

namespace cake::kernels::conv1d {

// The unsigned type of `bytes` bytes, for one vector load or store. Bits move between a vector
// and a T array by memcpy: reading a T array through a vector pointer breaks strict aliasing, and
// the emulator's host compiler reorders such code (the GPU compiles both forms alike).
template <int bytes>
struct Bits;
template <>
struct Bits<4> {
  using Type = unsigned;
};
template <>
struct Bits<8> {
  using Type = uint2;
};
template <>
struct Bits<16> {
  using Type = uint4;
};

// The dtype helpers (common/dtype.cuh), by the names the conv's stages use.
using kernels::from_float;
using kernels::load_small;
using kernels::store_small;
using kernels::to_float;

// Channels [d, d + V) of the token row starting at row (a pointer to channel 0).
template <class T, int V>
__device__ __forceinline__ void load_row(T const* row, int d, int dim, bool vectorised,
                                         float (&out)[V]) {
  using Vector = typename Bits<V * sizeof(T)>::Type;
  alignas(16) T raw[V];
  if (vectorised) {
    Vector const bits = *reinterpret_cast<Vector const*>(row + d);
    memcpy(raw, &bits, sizeof bits);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) raw[j] = d + j < dim ? row[d + j] : from_float<T>(0.f);
  }
#pragma unroll
  for (int j = 0; j < V; ++j) out[j] = to_float(raw[j]);
}

// Rows rows[k * stride] for k < count (count <= N) of channels [d, d + V), as load_row. A full
// vectorised batch issues its N loads before converting any (one basic block, N loads in flight):
// with a branch per row, each row's conversion waits for its load before the next is issued.
template <class T, int V, int N>
__device__ __forceinline__ void load_rows(T const* rows, int64_t stride, int count, int d, int dim,
                                          bool vectorised, float (&out)[N][V]) {
  using Vector = typename Bits<V * sizeof(T)>::Type;
  if (vectorised && count == N) {
    Vector raw[N];
#pragma unroll
    for (int k = 0; k < N; ++k) raw[k] = *reinterpret_cast<Vector const*>(rows + k * stride + d);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      T parts[V];
      memcpy(parts, &raw[k], sizeof parts);
#pragma unroll
      for (int j = 0; j < V; ++j) out[k][j] = to_float(parts[j]);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < count) load_row<T, V>(rows + k * stride, d, dim, vectorised, out[k]);
  }
}

// N token rows of channels [d, d + V) kept as the bits loaded (N vectors of V * sizeof(T) bytes),
// so that a row's load is issued long before the row is used: issue(k, ...) starts row k's load
// and does not wait for it; unpack(k, out) converts row k to float, waiting for it only then.
// Without `vectorised` the row is read element by element (channels past D as 0) and, for 16-bit
// T, packed at once, which waits for those loads: correct, just not ahead. k must be a constant
// after unrolling, else raw[] moves to local memory.
template <class T, int V, int N>
struct RowBatch {
  using Vector = typename Bits<V * sizeof(T)>::Type;
  Vector raw[N];

  __device__ __forceinline__ void issue(int k, T const* row, int d, int dim, bool vectorised) {
    if (vectorised) {
      raw[k] = *reinterpret_cast<Vector const*>(row + d);
      return;
    }
    T parts[V];
#pragma unroll
    for (int j = 0; j < V; ++j) parts[j] = d + j < dim ? row[d + j] : from_float<T>(0.f);
    memcpy(&raw[k], parts, sizeof raw[k]);
  }

  __device__ __forceinline__ void unpack(int k, float (&out)[V]) const {
    T parts[V];
    memcpy(parts, &raw[k], sizeof parts);
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = to_float(parts[j]);
  }
};

template <class T, int V>
__device__ __forceinline__ void store_row(T* row, int d, int dim, bool vectorised,
                                          float const (&in)[V]) {
  using Vector = typename Bits<V * sizeof(T)>::Type;
  alignas(16) T raw[V];
#pragma unroll
  for (int j = 0; j < V; ++j) raw[j] = from_float<T>(in[j]);
  if (vectorised) {
    Vector bits;
    memcpy(&bits, raw, sizeof bits);
    *reinterpret_cast<Vector*>(row + d) = bits;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (d + j < dim) row[d + j] = raw[j];
    }
  }
}

// e[q] of document n (its first token at bos), channel d: the token when q >= bos, else the
// initial state's column W + q - bos (h0 [N, D, W], or zero without one).
template <class T, int W>
__device__ __forceinline__ float extended_one(T const* x, void const* h0, cakeDtype_t h0_dtype,
                                              int dim, int64_t n, int64_t bos, int64_t q, int d) {
  if (q >= bos) return to_float(x[q * dim + d]);
  return h0 != nullptr ? load_small(h0, h0_dtype, (n * dim + d) * W + W + (q - bos)) : 0.f;
}

// The same for channels [d, d + V).
template <class T, int W, int V>
__device__ __forceinline__ void extended(T const* x, void const* h0, cakeDtype_t h0_dtype, int dim,
                                         bool vectorised, int64_t n, int64_t bos, int64_t q, int d,
                                         float (&out)[V]) {
  if (q >= bos) {
    load_row(x + q * dim, d, dim, vectorised, out);
    return;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    out[j] = h0 != nullptr && d + j < dim
                 ? load_small(h0, h0_dtype, (n * dim + d + j) * W + W + (q - bos))
                 : 0.f;
  }
}

// weight[c, :] and bias[c] (0 without one) of channels c in [d, d + V); 0 past D.
template <int V, int W>
__device__ __forceinline__ void load_taps(void const* weight, cakeDtype_t weight_dtype,
                                          void const* bias, cakeDtype_t bias_dtype, int dim, int d,
                                          float (&w)[W][V], float (&b)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) {
    bool const in = d + j < dim;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      w[i][j] = in ? load_small(weight, weight_dtype, int64_t{d + j} * W + i) : 0.f;
    }
    b[j] = in && bias != nullptr ? load_small(bias, bias_dtype, d + j) : 0.f;
  }
}

// The documents of a pack: cu_seqlens [N + 1] (int32 or int64) on the device, or, without it,
// N rows of seq_len tokens.
struct Documents {
  void const* cu_seqlens = nullptr;
  bool cu_int64 = false;
  int64_t seq_len = 0;
  int64_t num_seqs = 0;

  __device__ __forceinline__ int64_t start(int64_t n) const {
    if (cu_seqlens == nullptr) return n * seq_len;
    return cu_int64 ? static_cast<int64_t const*>(cu_seqlens)[n]
                    : static_cast<int32_t const*>(cu_seqlens)[n];
  }

  // The document holding token t (the first whose end is past t: empty documents at t are
  // skipped), by binary search over the device offsets.
  __device__ __forceinline__ int64_t of(int64_t t) const {
    if (cu_seqlens == nullptr) return seq_len > 0 ? t / seq_len : 0;
    int64_t lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
      int64_t const mid = (lo + hi) / 2;
      if (start(mid + 1) > t) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }
};

__device__ __forceinline__ float sigmoid(float p) { return 1.f / (1.f + __expf(-p)); }

// act(p): identity or silu.
__device__ __forceinline__ float activate(int activation, float p) {
  return activation == cakeActivationSilu ? p * sigmoid(p) : p;
}

// d act / d p at p.
__device__ __forceinline__ float activation_slope(int activation, float p) {
  if (activation != cakeActivationSilu) return 1.f;
  float const s = sigmoid(p);
  return s * (1.f + p * (1.f - s));
}

// The compiled variants: x's dtype T and the width W.
template <class T, int W>
struct Variant {
  using Type = T;
  static constexpr int kWidth = W;
};

template <class T, class F>
cudaError_t dispatch_width(int width, F&& f) {
  switch (width) {
    case 2:
      return f(Variant<T, 2>{});
    case 3:
      return f(Variant<T, 3>{});
    case 4:
      return f(Variant<T, 4>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// f(Variant<T, W>{}) for the call's dtype and width; cudaErrorInvalidValue for others (the op's
// support check admits none).
template <class F>
cudaError_t dispatch(cakeDtype_t dtype, int width, F&& f) {
  switch (dtype) {
    case cakeBfloat16:
      return dispatch_width<__nv_bfloat16>(width, f);
    case cakeFloat16:
      return dispatch_width<__half>(width, f);
    case cakeFloat32:
      return dispatch_width<float>(width, f);
    default:
      return cudaErrorInvalidValue;
  }
}

// Blocks along the two grid axes (x: up to 2^31 - 1, y: up to 65535).
struct Grid {
  unsigned x, y;
};

inline unsigned blocks(int64_t n, int64_t per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

}  // namespace cake::kernels::conv1d
