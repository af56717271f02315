// One table of (device, variant) -> implementation: what the C entry points (api.cpp) run after
// the shared validation. Each implementation checks first what it supports (support.hpp), then
// answers its byte queries and runs. Adding an implementation (KDA's kernels, say) is one row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cake/cake.h"
#include "ops/validate.hpp"

namespace cake::ops {

struct Implementation {
  int32_t device_type;  // cakeCPU or cakeCUDA
  cakeVariant_t variant;
  char const* support;  // one line: what it accepts (cakeGetBuildInfo)
  // Throw a cake::Error for a validated call this implementation cannot run.
  void (*check_forward)(cakeOptions_t const&, cakeForwardArgs_t const&, Dims const&);
  void (*check_backward)(cakeOptions_t const&, cakeBackwardArgs_t const&, Dims const&);
  // Exact bytes of the saved set (the same for a forward and its backward) and of the scratch.
  size_t (*saved_bytes)(cakeOptions_t const&, cakeTensor_t const& q, cakeTensor_t const& v,
                        cakeTensor_t const& cu_seqlens);
  size_t (*forward_workspace_bytes)(cakeOptions_t const&, cakeForwardArgs_t const&);
  size_t (*backward_workspace_bytes)(cakeOptions_t const&, cakeBackwardArgs_t const&);
  void (*forward)(cakeOptions_t const&, cakeForwardArgs_t const&, Dims const&, void* saved,
                  void* workspace, size_t workspace_bytes, void* stream);
  void (*backward)(cakeOptions_t const&, cakeBackwardArgs_t const&, Dims const&, void const* saved,
                   void* workspace, size_t workspace_bytes, void* stream);
};

// The public name of a variant's op: "chunk_gated_delta_rule" or "chunk_kda".
char const* op_name(cakeVariant_t variant);

// The implementation of variant on device_type; a cake::Error (cakeNotImplemented) naming what is
// missing when there is none.
Implementation const& implementation_for(int32_t device_type, cakeVariant_t variant);

// Every row of the table, for cakeGetBuildInfo.
Implementation const* implementations_begin();
Implementation const* implementations_end();

}  // namespace cake::ops
