// The column slices of a walk: a CTA owns all of the state's 128 columns, or, where the walks are
// split (walk_a_fwd/split.hpp says when), one of kSlicesOfH slices of kSliceCols columns. The
// h-walk's flag of a walk counts the slices of h stored: kSlicesOfH once all are. Host and device.
#pragma once

#include "kernels/common/problem.hpp"

namespace cake::kernels {

inline constexpr int kSliceCols = 64;
inline constexpr int kSlicesOfH = kHeadDim / kSliceCols;

}  // namespace cake::kernels
