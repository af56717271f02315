// What cake.build_info() reports of a build with the kernels compiled in.
#include <cuda_runtime_api.h>

#include "ops/activations_cuda.hpp"

namespace cake::ops {

CudaBuild cuda_build() { return {true, "sm_90a", CUDART_VERSION}; }

}  // namespace cake::ops
