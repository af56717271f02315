// The SM count of the current device, for launches whose grid depends on it (the walks' split
// rule, walk_a_fwd/split.hpp; the persistent CTAs of kkt_solve and intra_bwd). An attribute: no
// host sync.
#pragma once

#include <cuda_runtime_api.h>

namespace cake::kernels {

inline cudaError_t current_sm_count(int* num_sms) {
  int device = 0;
  if (cudaError_t const err = cudaGetDevice(&device); err != cudaSuccess) return err;
  return cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, device);
}

}  // namespace cake::kernels
