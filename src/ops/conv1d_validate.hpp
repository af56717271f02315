// The checks of cakeConv1dForward / cakeConv1dBackward's arguments that hold on every device
// (shapes, dtypes, devices, activation), before any work; what one implementation supports
// beyond them is checked by it (conv1d_support.hpp).
#pragma once

#include <cstdint>

#include "cake/cake.h"

namespace cake::ops {

// The sizes of one validated conv call.
struct Conv1dDims {
  int64_t batch = 0;        // B
  int64_t seq_len = 0;      // T (per batch row; with cu_seqlens, all tokens of the pack)
  int64_t dim = 0;          // D
  int64_t width = 0;        // W
  int64_t num_seqs = 0;     // N: documents of cu_seqlens, else B
  int32_t device_type = 0;  // cakeCPU or cakeCUDA, shared by every tensor
};

Conv1dDims validate_conv1d_forward(cakeConv1dForwardArgs_t const* args);
Conv1dDims validate_conv1d_backward(cakeConv1dBackwardArgs_t const* args);

// No output shares memory with an input or another output. Only for the runs: the size queries
// take placeholder data pointers (any non-NULL ones, maybe all the same).
void check_conv1d_forward_apart(cakeConv1dForwardArgs_t const& args);
void check_conv1d_backward_apart(cakeConv1dBackwardArgs_t const& args);

}  // namespace cake::ops
