// Token-by-token recurrence in FP64: the ground truth of every test.
//
// Forward walks each (document, value head) token by token. Backward is written analytically
// (reverse-mode through the recurrence), re-walking each document from states kept every
// kCheckpointInterval tokens so that memory stays O(T / interval * K * V) per head.
#pragma once

#include "ref/problem.hpp"

namespace cake::ref {

void recurrent_forward(Shape const& shape, Inputs const& in, Outputs const& out);

void recurrent_backward(Shape const& shape, Inputs const& in, OutputGrads const& grad_out,
                        InputGrads const& grad_in);

}  // namespace cake::ref
