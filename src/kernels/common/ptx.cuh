// Raw PTX behind named functions: the only file of cake with inline assembly. Under the CPU
// emulator (tests/emu, CAKE_EMULATE) the same functions come from emu/ptx.hpp instead.
#pragma once

#if defined(CAKE_EMULATE)
#include "emu/ptx.hpp"
#else

#include <cstdint>

namespace cake::kernels {

// D = A B + D on the tensor cores: one warp, A 16x16 bf16 (row), B 16x8 bf16 (col), D 16x8 fp32.
// Fragment ownership (lane = 4 * group + quad):
//   a[0]: A[group][2quad..+1]      a[1]: A[group+8][2quad..+1]
//   a[2]: A[group][2quad+8..+9]    a[3]: A[group+8][2quad+8..+9]
//   b[0]: B[2quad..+1][group]      b[1]: B[2quad+8..+9][group]
//   d[0..1]: D[group][2quad..+1]   d[2..3]: D[group+8][2quad..+1]
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], uint32_t const (&a)[4],
                                                  uint32_t const (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D = A B + D on the tensor cores in tf32: one warp, A 16x8 (row), B 8x8 (col), D 16x8 fp32.
// Fragment ownership (lane = 4 * group + quad):
//   a[0]: A[group][quad]      a[1]: A[group+8][quad]
//   a[2]: A[group][quad+4]    a[3]: A[group+8][quad+4]
//   b[0]: B[quad][group]    b[1]: B[quad+4][group]
//   d: as for mma_m16n8k16_bf16
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], uint32_t const (&a)[4],
                                                 uint32_t const (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// x rounded to tf32 (nearest, ties away), as the bits of an fp32 with the low 13 mantissa bits 0.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// Asynchronous 16-byte copy global -> shared (L2 only); valid == false writes 16 zero bytes and
// reads nothing (src must still be a mapped address).
__device__ __forceinline__ void cp_async_16(void* smem, void const* gmem, bool valid) {
  uint32_t const dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int const src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

// Asynchronous 4-byte copy global -> shared (through L1); valid == false writes zero.
__device__ __forceinline__ void cp_async_4(void* smem, void const* gmem, bool valid) {
  uint32_t const dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int const src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix
// l / 8. Without .trans thread t gets (row t / 4, columns 2 (t % 4) + {0, 1}) of each matrix;
// with .trans it gets (rows 2 (t % 4) + {0, 1}, column t / 4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], void const* smem) {
  uint32_t const addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], void const* smem) {
  uint32_t const addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

}  // namespace cake::kernels

#endif  // CAKE_EMULATE
