// The CPU path of cakeForward / cakeBackward: the FP64 reference on validated CPU tensors.
#pragma once

#include "cake/cake.h"
#include "ops/validate.hpp"

namespace cake::ops {

void reference_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, Dims const& d);
void reference_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                        Dims const& d);

}  // namespace cake::ops
