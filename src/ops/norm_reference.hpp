// The CPU path of cakeRmsNormForward / cakeRmsNormBackward: the FP64 reference (ref/norm.hpp) on
// validated CPU tensors of any float dtype, results rounded into the outputs' dtypes.
#pragma once

#include "cake/cake.h"
#include "ops/norm_validate.hpp"

namespace cake::ops {

void norm_reference_forward(cakeRmsNormForwardArgs_t const& args, NormDims const& d);
void norm_reference_backward(cakeRmsNormBackwardArgs_t const& args, NormDims const& d);

}  // namespace cake::ops
