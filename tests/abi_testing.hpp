// Test helpers for the C ABI shared by the C++ tests (tests/cpp) and the GPU check (tests/cuda).
#pragma once

#include "cake/cake.h"

namespace cake::testing {

// A backward call's arguments with the forward's inputs filled in (cakeBackwardArgs_t repeats
// them unchanged); the caller adds dout, dht and the gradients it wants.
inline cakeBackwardArgs_t backward_inputs(cakeForwardArgs_t const& f) {
  cakeBackwardArgs_t b{};
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.g = f.g;
  b.beta = f.beta;
  b.initial_state = f.initial_state;
  b.cu_seqlens = f.cu_seqlens;
  b.A_log = f.A_log;
  b.dt_bias = f.dt_bias;
  return b;
}

}  // namespace cake::testing
