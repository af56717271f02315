// Built without the CUDA kernels: CUDA tensors get a clear cakeNotImplemented.
#include "ops/norm_cuda.hpp"

#include "core/error.hpp"

namespace cake::ops {

namespace {
[[noreturn]] void unavailable() {
  throw Error(cakeNotImplemented,
              "this cake was built without CUDA (no CUDA compiler was found, or CAKE_CUDA=OFF): "
              "rms_norm_gated on CUDA tensors is not supported; reinstall where nvcc is found "
              "(cake.build_info() says what was built) or pass CPU tensors");
}
}  // namespace

size_t norm_cuda_backward_workspace_bytes(cakeRmsNormBackwardArgs_t const&, NormDims const&) {
  unavailable();
}
void norm_cuda_forward(cakeRmsNormForwardArgs_t const&, NormDims const&, void*) { unavailable(); }
void norm_cuda_backward(cakeRmsNormBackwardArgs_t const&, NormDims const&, void*, size_t, void*) {
  unavailable();
}

}  // namespace cake::ops
