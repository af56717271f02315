// The conv's table of device -> implementation, in the style of dispatch.hpp: what the conv's C
// entry points (conv1d_api.cpp) run after the shared validation. Each implementation checks
// first what it supports (conv1d_support.hpp), then answers its byte queries and runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cake/cake.h"
#include "ops/conv1d_validate.hpp"

namespace cake::ops {

struct Conv1dImplementation {
  int32_t device_type;  // cakeCPU or cakeCUDA
  char const* support;  // one line: what it accepts (cakeGetBuildInfo)
  // Throw a cake::Error for a validated call this implementation cannot run.
  void (*check_forward)(cakeConv1dForwardArgs_t const&, Conv1dDims const&);
  void (*check_backward)(cakeConv1dBackwardArgs_t const&, Conv1dDims const&);
  // Exact bytes of the scratch memory.
  size_t (*forward_workspace_bytes)(cakeConv1dForwardArgs_t const&, Conv1dDims const&);
  size_t (*backward_workspace_bytes)(cakeConv1dBackwardArgs_t const&, Conv1dDims const&);
  void (*forward)(cakeConv1dForwardArgs_t const&, Conv1dDims const&, void* workspace,
                  size_t workspace_bytes, void* stream);
  void (*backward)(cakeConv1dBackwardArgs_t const&, Conv1dDims const&, void* workspace,
                   size_t workspace_bytes, void* stream);
};

// The public name of the op.
inline constexpr char const* kConv1dOpName = "causal_conv1d";

Conv1dImplementation const& conv1d_implementation_for(int32_t device_type);

// Every row of the table, for cakeGetBuildInfo.
Conv1dImplementation const* conv1d_implementations_begin();
Conv1dImplementation const* conv1d_implementations_end();

}  // namespace cake::ops
