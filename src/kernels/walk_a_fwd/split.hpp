// When the forward walk's launch splits its walks by h's columns (roles.cuh: a CTA per walk, or
// per 64-column slice of a walk, two per walk), from the launch's shape alone: a pure function of
// the number of walks W = N x HV and the device's SMs S (no lengths: the documents' bounds are on
// the device, and reading them would be a host sync).
//
// A CTA takes an SM (one per SM: ~200 KB of shared memory). A half-width CTA's chunk step tau'
// is shorter than the whole walk's tau (its state roles form half as many columns each, its
// output roles half of O; the loads and the gates are the same), but two of them take two SMs.
// - 2 W <= S: all W walks split. The 2 W CTAs run at once, so the launch takes its longest walk's
//   chunks x tau' instead of x tau: the SMs it takes were idle.
// - S / 2 < W <= S: none. Splitting the S - W longest walks would keep one wave, but a grid of
//   both widths needs both in one kernel (the width is wgmma's N, a template value).
// - W > S: none. The walks past the first wave start as first-wave walks end, at times set by the
//   lengths. At GDN workload A (S = 132; 48 value heads of documents of 1536, 1024, 896 and 640
//   chunks: W = 192, longest first) 36 SMs free at 896 tau and 48 at 1024 tau; unsplit, the last
//   walk ends at 1792 tau (12 of 896 chunks from 896 tau). Its 60 last walks split into 120 CTAs
//   (tau' ~ 0.7 tau): 36 start at 896 tau, 48 at 1024 tau, and 36 wait for those (1344 tau,
//   1472 tau) and end at 1472 tau + 640 x 0.7 tau = 1920 tau: later. Splitting the 12 walks of
//   896 chunks alone would end at 1664 tau, but which walks gain depends on the lengths.
#pragma once

#include <cstdint>

#include "kernels/common/walk_slices.hpp"

namespace cake::kernels::walk_a_fwd {

constexpr bool split_walks(int64_t num_walks, int num_sms) {
  return num_walks > 0 && kSlicesOfH * num_walks <= num_sms;
}

}  // namespace cake::kernels::walk_a_fwd
