// The checks of cakeRmsNormForward / cakeRmsNormBackward's arguments that hold on every device
// (shapes, dtypes, devices, activation, eps), before any work; what one implementation supports
// beyond them is checked by it (norm_support.hpp).
#pragma once

#include <cstdint>

#include "cake/cake.h"

namespace cake::ops {

// The sizes of one validated norm call.
struct NormDims {
  int64_t rows = 0;         // the product of x's leading sizes
  int64_t dim = 0;          // N: x's last size
  int32_t device_type = 0;  // cakeCPU or cakeCUDA, shared by every tensor
};

NormDims validate_norm_forward(cakeRmsNormForwardArgs_t const* args);
NormDims validate_norm_backward(cakeRmsNormBackwardArgs_t const* args);

// No output shares memory with an input or another output. Only for the runs: the size queries
// take placeholder data pointers (any non-NULL ones, maybe all the same).
void check_norm_forward_apart(cakeRmsNormForwardArgs_t const& args);
void check_norm_backward_apart(cakeRmsNormBackwardArgs_t const& args);

}  // namespace cake::ops
