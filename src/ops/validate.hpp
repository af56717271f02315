// The checks of the arguments of cakeForward / cakeBackward that hold on every device (shapes,
// dtypes, devices, options), before any work; what one implementation supports beyond them is
// checked by that implementation (support.hpp). Every failure is a cake::Error naming the
// argument, what was expected and what came.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cake/cake.h"

namespace cake::ops {

// The sizes of one validated call.
struct Dims {
  int64_t batch = 0;         // B
  int64_t seq_len = 0;       // T (per batch row; with cu_seqlens, all tokens of the pack)
  int64_t num_qk_heads = 0;  // H
  int64_t num_v_heads = 0;   // HV
  int64_t head_dim_k = 0;    // K
  int64_t head_dim_v = 0;    // V
  int64_t num_seqs = 0;      // N: documents of cu_seqlens, else B
  int32_t device_type = 0;   // cakeCPU or cakeCUDA, shared by every tensor
};

Dims validate_forward(cakeOptions_t const* options, cakeForwardArgs_t const* args);
Dims validate_backward(cakeOptions_t const* options, cakeBackwardArgs_t const* args);

// No output shares memory with an input or another output. Only for the runs: the size queries
// take placeholder data pointers (any non-NULL ones, maybe all the same).
void check_forward_apart(cakeForwardArgs_t const& args);
void check_backward_apart(cakeBackwardArgs_t const& args);

// The saved-set buffer of cakeForward / cakeBackward against options.save_for_backward and
// expected_bytes, the device's saved-size query for the validated call (0 on the CPU).
void validate_saved(cakeOptions_t const& options, void const* saved, size_t saved_bytes,
                    size_t expected_bytes);

}  // namespace cake::ops
