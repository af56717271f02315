// Raw PTX behind named functions: the only file of cake with inline assembly.
#pragma once

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

}  // namespace cake::kernels
