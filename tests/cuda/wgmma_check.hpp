// GPU self-test of the wgmma building blocks (src/kernels/common/wgmma.cuh).
#pragma once

// Runs warpgroup products C = A B ([64 x 128] x [128 x N]) for every pair of operand majors, two
// widths and a column offset into B, against a double-precision product of the same bf16 values;
// prints one line per case and returns whether all pass.
bool check_wgmma();
