// The logistic function: approximate for the streaming stages (the conv's SiLU, the output
// norm's gate), exact for the gate stage.
#pragma once

#include <cuda_runtime_api.h>

namespace cake::kernels {

// 1 / (1 + e^-x) from the approximate e^x and division (a few ulp, ~6 instructions where the IEEE
// division alone takes ~18: in a stage that reads 16 bytes a thread and token, the instruction
// count otherwise nears the memory time). For x below ~-87 e^-x is inf and the quotient 0.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }

// The same, rounded as the IEEE expf and division round: for the gate stage, whose g and beta feed
// every later stage's decays, and whose few elements a token make its instruction count moot.
__device__ __forceinline__ float sigmoid_exact(float x) { return 1.f / (1.f + expf(-x)); }

// sigmoid'(x) = s (1 - s), as e / (1 + e)^2 with e = e^-|x|: the product s (1 - s) loses all of
// 1 - s once s rounds to 1 (x above ~17 in float), where the slope is still ~e^-x.
__device__ __forceinline__ float sigmoid_slope(float x) {
  float const e = __expf(-fabsf(x)), r = __fdividef(1.f, 1.f + e);
  return e * r * r;
}

// silu'(x) for silu(x) = x sigmoid(x), from the approximate sigmoid: s (1 + x (1 - s)). Where s
// rounds to 1 the lost x (1 - s) is below x e^-x against a slope of ~1: no loss that matters.
__device__ __forceinline__ float silu_slope(float x) {
  float const s = sigmoid(x);
  return s * (1.f + x * (1.f - s));
}

// sigmoid_slope rounded as the IEEE expf and division round (the gate stage).
__device__ __forceinline__ float sigmoid_slope_exact(float x) {
  float const e = expf(-fabsf(x)), r = 1.f / (1.f + e);
  return e * r * r;
}

}  // namespace cake::kernels
