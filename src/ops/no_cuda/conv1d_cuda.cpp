// Built without the CUDA kernels: CUDA tensors get a clear cakeNotImplemented.
#include "ops/conv1d_cuda.hpp"

#include "core/error.hpp"

namespace cake::ops {

namespace {
[[noreturn]] void unavailable() {
  throw Error(cakeNotImplemented,
              "this cake was built without CUDA (no CUDA compiler was found, or CAKE_CUDA=OFF): "
              "causal_conv1d on CUDA tensors is not supported; reinstall where nvcc is found "
              "(cake.build_info() says what was built) or pass CPU tensors");
}
}  // namespace

size_t conv1d_cuda_forward_workspace_bytes(cakeConv1dForwardArgs_t const&, Conv1dDims const&) {
  unavailable();
}
size_t conv1d_cuda_backward_workspace_bytes(cakeConv1dBackwardArgs_t const&, Conv1dDims const&) {
  unavailable();
}
void conv1d_cuda_forward(cakeConv1dForwardArgs_t const&, Conv1dDims const&, void*, size_t, void*) {
  unavailable();
}
void conv1d_cuda_backward(cakeConv1dBackwardArgs_t const&, Conv1dDims const&, void*, size_t,
                          void*) {
  unavailable();
}

}  // namespace cake::ops
