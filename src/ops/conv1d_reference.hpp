// The CPU path of cakeConv1dForward / cakeConv1dBackward: the FP64 reference (ref/conv1d.hpp)
// on validated CPU tensors of any float dtype, results rounded into the outputs' dtypes.
#pragma once

#include "cake/cake.h"
#include "ops/conv1d_validate.hpp"

namespace cake::ops {

void conv1d_reference_forward(cakeConv1dForwardArgs_t const& args, Conv1dDims const& d);
void conv1d_reference_backward(cakeConv1dBackwardArgs_t const& args, Conv1dDims const& d);

}  // namespace cake::ops
