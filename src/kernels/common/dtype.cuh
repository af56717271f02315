// Element loads and stores in a tensor's dtype (float32, bfloat16 or float16), with FP32
// arithmetic: compile-time for the large token-major tensors a kernel is instantiated for, and
// runtime (a switch on the dtype) for small tensors or elementwise passes whose loads are not
// the bound.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cake/cake.h"

namespace cake::kernels {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// Element i of a tensor of runtime dtype (float32, bfloat16 or float16).
__device__ __forceinline__ float load_small(void const* p, cakeDtype_t dtype, int64_t i) {
  switch (dtype) {
    case cakeBfloat16:
      return to_float(static_cast<__nv_bfloat16 const*>(p)[i]);
    case cakeFloat16:
      return to_float(static_cast<__half const*>(p)[i]);
    default:
      return static_cast<float const*>(p)[i];
  }
}

__device__ __forceinline__ void store_small(void* p, cakeDtype_t dtype, int64_t i, float x) {
  switch (dtype) {
    case cakeBfloat16:
      static_cast<__nv_bfloat16*>(p)[i] = from_float<__nv_bfloat16>(x);
      break;
    case cakeFloat16:
      static_cast<__half*>(p)[i] = from_float<__half>(x);
      break;
    default:
      static_cast<float*>(p)[i] = x;
  }
}

}  // namespace cake::kernels
