// What every GPU path (gdn_cuda.cpp, kda_cuda.cpp, activations.cpp, conv1d_cuda.cpp,
// norm_cuda.cpp) checks at its seam: CUDA errors as cake::Error, and the alignment of the bases
// the kernels' vector loads and stores need.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cake/cake.h"
#include "core/error.hpp"

namespace cake::ops::cuda {

inline void check_cuda(cudaError_t err, char const* what) {
  if (err != cudaSuccess)
    throw Error(cakeCudaError,
                concat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

// t's base address a multiple of bytes (an absent tensor passes): a contiguous view at an odd
// offset is not, though its strides are. E.g. GDN's and KDA's kernels read q, k, v, dout in
// 16-byte vectors (cp.async), write o, dq, dk, dv in bf16 pairs and move the fp32 states two
// floats at a time; the norm's read and write every row in 16-byte vectors.
inline void check_aligned(char const* name, cakeTensor_t const& t, uintptr_t bytes) {
  CAKE_CHECK(t.data == nullptr || reinterpret_cast<uintptr_t>(t.data) % bytes == 0,
             cakeNotSupported, name, " must be ", bytes,
             "-byte aligned for the CUDA kernels, got address ", t.data);
}

}  // namespace cake::ops::cuda
