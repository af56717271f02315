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
#include "kernels/common/ptx.cuh"
#include "kernels/common/sigmoid.cuh"

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
using kernels::sigmoid;
using kernels::silu_slope;
using kernels::store_small;
using kernels::to_float;

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

// Channels [d, d + V) of the token row starting at row (a pointer to channel 0), at once.
template <class T, int V>
__device__ __forceinline__ void load_row(T const* row, int d, int dim, bool vectorised,
                                         float (&out)[V]) {
  RowBatch<T, V, 1> one;
  one.issue(0, row, d, dim, vectorised);
  one.unpack(0, out);
}

// The block's input ring: the token-major inputs (x, and residual or dy) of a walk over tokens
// [t_begin, t_begin + tokens) and channels [c0, c0 + kThreads V), staged through kRingStages slots
// of shared memory, kStageBytes a tensor a stage (8 tokens of 16-bit x, 4 of fp32). With
// `bulk_rows` (every row's segment 16-byte aligned: D sizeof(T) % 16 == 0 and aligned bases)
// warp 0 fills a slot with one bulk copy a row (lane r: row r % n of tensor r / n, n <= K the
// stage's rows), completing on the slot's mbarrier; the threads wait on it, read their V channels
// of each row from shared memory, and after a block barrier warp 0 refills the slot kRingStages
// stages ahead. Without, each thread copies its own channels (load_row's vector or element loads,
// channels past D as 0) when it reaches the stage: correct, not ahead. Channels past D (the last
// channel block) are not copied; their threads read stale shared memory and store nothing.
// Shared memory: the slots' mbarriers (kRingHeader bytes), then the slots, T
// [kRingStages][tensors][K][kThreads * V].
inline constexpr int kRingStages = 3;
inline constexpr int kStageBytes = 8192;
inline constexpr int kRingHeader = 128;
inline constexpr size_t ring_shared_bytes(int tensors) {
  return kRingHeader + size_t{kRingStages} * static_cast<size_t>(tensors) * kStageBytes;
}

template <class T, int kThreads, int V>
struct RowRing {
  static constexpr int kChannels = kThreads * V;
  static constexpr int K = kStageBytes / (kChannels * static_cast<int>(sizeof(T)));
  static_assert(K * kChannels * static_cast<int>(sizeof(T)) == kStageBytes && K >= 1);
  static_assert(2 * K <= 32, "warp 0 copies a stage's rows of two tensors, one a lane");
  using Vector = typename Bits<V * sizeof(T)>::Type;

  uint64_t* full;  // [kRingStages]
  T* slots;
  T const* src0;  // the tensors' rows at channel 0 (two pointers, not an array: a runtime index
  T const* src1;  // into one moves the ring to local memory)
  int tensors;    // 1 or 2
  int64_t t_begin;
  int tokens;  // rows of each tensor, stages() stages
  int dim, c0;
  bool bulk_rows, vectorised;

  // The ring of the dynamic shared memory at smem (kRingHeader-aligned); thread 0 initialises the
  // barriers, and the block barrier makes them visible before any issue or wait.
  __device__ __forceinline__ RowRing(char* smem, T const* a, T const* b, int64_t t_begin_,
                                     int tokens_, int dim_, int c0_, bool bulk, bool vec)
      : full(reinterpret_cast<uint64_t*>(smem)),
        slots(reinterpret_cast<T*>(smem + kRingHeader)),
        src0(a),
        src1(b),
        tensors(b != nullptr ? 2 : 1),
        t_begin(t_begin_),
        tokens(tokens_),
        dim(dim_),
        c0(c0_),
        bulk_rows(bulk),
        vectorised(vec) {
    if (bulk_rows && threadIdx.x == 0) {
#pragma unroll
      for (int s = 0; s < kRingStages; ++s) mbarrier_init(&full[s], 1);
      mbarrier_init_fence();
    }
    __syncthreads();
  }

  __device__ __forceinline__ int stages() const { return (tokens + K - 1) / K; }
  __device__ __forceinline__ int rows_in(int i) const {
    return tokens - i * K < K ? tokens - i * K : K;
  }
  __device__ __forceinline__ T const* source(int j) const { return j == 0 ? src0 : src1; }
  // Row k of tensor j of stage i, channel 0 of the block.
  __device__ __forceinline__ T* row(int i, int j, int k) const {
    return slots + ((i % kRingStages * tensors + j) * K + k) * kChannels;
  }

  // Stage i's copies (bulk_rows, i < stages()), by warp 0; every thread calls it.
  __device__ __forceinline__ void issue(int i) const {
    if (!bulk_rows || i >= stages() || threadIdx.x >= 32) return;
    int const lane = static_cast<int>(threadIdx.x);
    int const rows = rows_in(i);
    int const channels = dim - c0 < kChannels ? dim - c0 : kChannels;
    uint32_t const bytes = static_cast<uint32_t>(channels) * sizeof(T);
    uint64_t* const bar = &full[i % kRingStages];
    // The stage's bytes are announced before any copy can complete some of them.
    if (lane == 0) mbarrier_arrive_expect_tx(bar, bytes * static_cast<uint32_t>(rows * tensors));
    __syncwarp();
    if (lane < rows * tensors) {
      int const j = lane / rows, k = lane % rows;
      bulk_load(row(i, j, k), source(j) + (t_begin + i * K + k) * dim + c0, bytes, bar);
    }
  }

  // The first kRingStages stages in flight (every thread calls it).
  __device__ __forceinline__ void start() const {
#pragma unroll
    for (int i = 0; i < kRingStages; ++i) issue(i);
  }

  // Stage i's rows readable by this thread: their copies landed (bulk_rows), else this thread's
  // channels copied now. Shared memory is only accessed as Vector (bulk copies write bytes).
  __device__ __forceinline__ void acquire(int i) const {
    if (bulk_rows) {
      mbarrier_wait(&full[i % kRingStages], (i / kRingStages) & 1);
      return;
    }
    int const v = static_cast<int>(threadIdx.x) * V;
    if (c0 + v >= dim) return;
    int const rows = rows_in(i);
    for (int j = 0; j < tensors; ++j) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (k >= rows) break;
        T const* from = source(j) + (t_begin + i * K + k) * dim + c0 + v;
        Vector bits;
        if (vectorised) {
          bits = *reinterpret_cast<Vector const*>(from);
        } else {
          T parts[V];
#pragma unroll
          for (int c = 0; c < V; ++c) parts[c] = c0 + v + c < dim ? from[c] : from_float<T>(0.f);
          memcpy(&bits, parts, sizeof bits);
        }
        *reinterpret_cast<Vector*>(row(i, j, k) + v) = bits;
      }
    }
  }

  // This thread's V channels of row k of tensor j of stage i (acquired), as float.
  __device__ __forceinline__ void read(int i, int j, int k, float (&out)[V]) const {
    Vector const bits =
        *reinterpret_cast<Vector const*>(row(i, j, k) + static_cast<int>(threadIdx.x) * V);
    T parts[V];
    memcpy(parts, &bits, sizeof parts);
#pragma unroll
    for (int c = 0; c < V; ++c) out[c] = to_float(parts[c]);
  }

  // After stage i is read: once every thread is done with its slot, stage i + kRingStages's
  // copies (a block barrier: every thread calls it, the same stages). The slot was read through
  // the generic proxy and is refilled through the async proxy: a barrier alone does not order
  // the two (PTX ISA, memory model: proxies), so every reader fences before it.
  __device__ __forceinline__ void release(int i) const {
    if (!bulk_rows || i + kRingStages >= stages()) return;
    fence_proxy_async_shared();
    __syncthreads();
    issue(i + kRingStages);
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

// act(p): identity or silu.
__device__ __forceinline__ float activate(int activation, float p) {
  return activation == cakeActivationSilu ? p * sigmoid(p) : p;
}

// d act / d p at p.
__device__ __forceinline__ float activation_slope(int activation, float p) {
  return activation == cakeActivationSilu ? silu_slope(p) : 1.f;
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
