// Device building blocks of the norm's kernels (norm_fwd, norm_bwd): a lane's place among its
// row's lanes (norm_rows.hpp), 16-byte vectors of a row in its dtype with FP32 arithmetic, sums
// over a row's lanes, the weight staged in shared memory, and the gate's activation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cake/cake.h"
#include "kernels/common/dtype.cuh"
#include "kernels/common/norm_rows.hpp"
#include "kernels/common/sigmoid.cuh"

namespace cake::kernels::norm {

// Elements of T in one 16-byte vector.
template <class T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

// The V elements at p (16-byte aligned) as floats, or zeros where `here` is false.
template <class T, int V = kVec<T>>
__device__ __forceinline__ void load_vector(T const* p, bool here, float (&out)[V]) {
  alignas(16) T parts[V];
  *reinterpret_cast<uint4*>(parts) = here ? *reinterpret_cast<uint4 const*>(p) : uint4{0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < V; ++j) out[j] = to_float(parts[j]);
}

template <class T, int V = kVec<T>>
__device__ __forceinline__ void store_vector(T* p, float const (&in)[V]) {
  alignas(16) T parts[V];
#pragma unroll
  for (int j = 0; j < V; ++j) parts[j] = from_float<T>(in[j]);
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<uint4 const*>(parts);
}

// The sum of v over the `lanes` lanes of each row (a power of two; a row's lanes are aligned to
// it). Every lane of the warp takes part, with the same `lanes`.
__device__ __forceinline__ float row_sum(float v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// weight [dim] (ones without one) into shared memory as floats, for the whole block; ends with a
// barrier.
__device__ __forceinline__ void stage_weight(void const* weight, cakeDtype_t dtype, int dim,
                                             float* staged) {
  for (int i = static_cast<int>(threadIdx.x); i < dim; i += kThreads) {
    staged[i] = weight != nullptr ? load_small(weight, dtype, i) : 1.f;
  }
  __syncthreads();
}

// act(g): silu g sigmoid(g), or sigmoid(g).
__device__ __forceinline__ float gate(int activation, float g) {
  float const s = sigmoid(g);
  return activation == cakeActivationSigmoid ? s : g * s;
}

// d act / d g at g.
__device__ __forceinline__ float gate_slope(int activation, float g) {
  return activation == cakeActivationSigmoid ? sigmoid_slope(g) : silu_slope(g);
}

// The compiled variants: the rows' dtype T and the vectors per lane S.
template <class T, int S>
struct Variant {
  using Type = T;
  static constexpr int kSlots = S;
};

template <class T, class F>
cudaError_t dispatch_slots(int slots, F&& f) {
  switch (slots) {
    case 1:
      return f(Variant<T, 1>{});
    case 2:
      return f(Variant<T, 2>{});
    case 4:
      return f(Variant<T, 4>{});
    case 8:
      // Only float32 rows of N > 512 take 8 vectors a lane.
      if constexpr (kVec<T> == 4) return f(Variant<T, 8>{});
      return cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;
  }
}

// f(Variant<T, S>{}) for the call's dtype and slots; cudaErrorInvalidValue for others (the op's
// support check admits none).
template <class F>
cudaError_t dispatch(cakeDtype_t dtype, int slots, F&& f) {
  switch (dtype) {
    case cakeBfloat16:
      return dispatch_slots<__nv_bfloat16>(slots, f);
    case cakeFloat16:
      return dispatch_slots<__half>(slots, f);
    case cakeFloat32:
      return dispatch_slots<float>(slots, f);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cake::kernels::norm
