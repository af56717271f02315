// Hopper's warpgroup products on the CPU emulator (runtime.hpp): wgmma.mma_async
// m64nNk16.f32.bf16.bf16 and its fence / commit_group / wait_group, each a meeting of the
// warpgroup's 128 threads; emu/ptx.hpp gives them ptx.cuh's names.
//
// Asynchronous as on the GPU (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
// an issue reads its two operands from the block's shared memory through their descriptors and
// its accumulators C from the 128 threads' registers (or, for a product into accumulators that
// an earlier one still in flight writes, that one's D); the product D = A B + C is computed and
// written into the registers when a wait_group completes its group. Then it checks what the
// kernel must not do meanwhile: the operands' shared-memory bytes must be as at issue, and the
// accumulator registers as the emulator last left them; either throws.
#pragma once

#include <cstdint>

namespace cake::emu {

// D[64 x n] (+)= A[64 x 16] B[16 x n] for this thread's warpgroup, d this thread's n / 2
// accumulators, scale-d 1. trans_a / trans_b: 0 for K-major operands, 1 for M-major A / N-major B.
void wgmma_issue(int n, bool trans_a, bool trans_b, float* d, uint64_t desc_a, uint64_t desc_b);
void wgmma_fence();
// Closes the products issued since the last commit into a group (possibly empty).
void wgmma_commit();
// Completes the warpgroup's committed groups but the `pending` most recent.
void wgmma_wait(int pending);

}  // namespace cake::emu
