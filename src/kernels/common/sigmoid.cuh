// The logistic function of the elementwise stages (the conv's SiLU, the output norm's gate).
#pragma once

#include <cuda_runtime_api.h>

namespace cake::kernels {

// 1 / (1 + e^-x) from the approximate e^x and division (a few ulp, ~6 instructions where the IEEE
// division alone takes ~18: in a stage that reads 16 bytes a thread and token, the instruction
// count otherwise nears the memory time). For x below ~-87 e^-x is inf and the quotient 0.
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }

}  // namespace cake::kernels
