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

}  // namespace cake::kernels
