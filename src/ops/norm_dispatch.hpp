// The norm's table of device -> implementation, in the style of conv1d_dispatch.hpp: what the
// norm's C entry points (norm_api.cpp) run after the shared validation. Each implementation checks
// first what it supports (norm_support.hpp), then answers its byte query and runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cake/cake.h"
#include "ops/norm_validate.hpp"

namespace cake::ops {

struct NormImplementation {
  int32_t device_type;  // cakeCPU or cakeCUDA
  char const* support;  // one line: what it accepts (cakeGetBuildInfo)
  // Throw a cake::Error for a validated call this implementation cannot run.
  void (*check_forward)(cakeRmsNormForwardArgs_t const&, NormDims const&);
  void (*check_backward)(cakeRmsNormBackwardArgs_t const&, NormDims const&);
  // Exact bytes of the backward's scratch memory.
  size_t (*backward_workspace_bytes)(cakeRmsNormBackwardArgs_t const&, NormDims const&);
  void (*forward)(cakeRmsNormForwardArgs_t const&, NormDims const&, void* stream);
  void (*backward)(cakeRmsNormBackwardArgs_t const&, NormDims const&, void* workspace,
                   size_t workspace_bytes, void* stream);
};

// The public name of the op.
inline constexpr char const* kNormOpName = "rms_norm_gated";

NormImplementation const& norm_implementation_for(int32_t device_type);

// Every row of the table, for cakeGetBuildInfo.
NormImplementation const* norm_implementations_begin();
NormImplementation const* norm_implementations_end();

}  // namespace cake::ops
