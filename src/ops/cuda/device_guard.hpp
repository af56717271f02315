// The tensors' device made current for a CUDA call, and the caller's restored after it: the
// launches, the kernels' shared-memory attributes and the stream all belong to the tensors'
// device, so a call on cuda:1 while cuda:0 is current runs as if cuda:1 were.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.hpp"

namespace cake::ops::cuda {

// Where no device can be asked (no GPU or driver: a build's host checks run there too), it
// leaves things as they are and the first launch reports why.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device), previous_(device) {
    int current = device;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();  // not left behind for a later launch's check to find
      return;
    }
    previous_ = current;
    cudaError_t const err = previous_ != device_ ? cudaSetDevice(device_) : cudaSuccess;
    if (err != cudaSuccess) {
      previous_ = device_;
      throw Error(cakeCudaError, concat("making device ", device_, " current: ",
                                        cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
    }
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(DeviceGuard const&) = delete;
  DeviceGuard& operator=(DeviceGuard const&) = delete;

 private:
  int device_;
  int previous_;
};

}  // namespace cake::ops::cuda
