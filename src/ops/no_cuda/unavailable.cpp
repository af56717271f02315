// Built without the CUDA kernels: CUDA tensors get a clear cakeNotImplemented, never a CPU
// fallback.
#include "core/error.hpp"
#include "ops/activations_cuda.hpp"

namespace cake::ops {

namespace {
[[noreturn]] void unavailable() {
  throw Error(cakeNotImplemented,
              "this cake was built without CUDA (no CUDA compiler was found, or CAKE_CUDA=OFF): "
              "CUDA tensors are not supported; reinstall where nvcc is found (cake.build_info() "
              "says what was built) or pass CPU tensors");
}
}  // namespace

CudaBuild cuda_build() { return {false, "", 0}; }

size_t cuda_saved_bytes(cakeOptions_t const&, cakeTensor_t const&, cakeTensor_t const&,
                        cakeTensor_t const&) {
  unavailable();
}
size_t cuda_forward_workspace_bytes(cakeOptions_t const&, cakeForwardArgs_t const&) {
  unavailable();
}
void cuda_forward(cakeOptions_t const&, cakeForwardArgs_t const&, void*, void*, size_t, void*) {
  unavailable();
}
size_t cuda_backward_workspace_bytes(cakeOptions_t const&, cakeBackwardArgs_t const&) {
  unavailable();
}
void cuda_backward(cakeOptions_t const&, cakeBackwardArgs_t const&, void const*, void*, size_t,
                   void*) {
  unavailable();
}

}  // namespace cake::ops
