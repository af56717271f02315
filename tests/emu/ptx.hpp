// The instructions of kernels/common/ptx.cuh on the CPU emulator (runtime.hpp): the same
// functions, computed from the fragment layouts that ptx.cuh documents (PTX ISA, "Matrix Fragments
// for mma.m16n8k16" / "m16n8k8", and ldmatrix). Warp-wide instructions meet the warp's 32 lanes;
// wgmma meets the warpgroup's 128 threads (emu/wgmma.hpp); named barriers are the runtime's.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "emu/runtime.hpp"
#include "emu/wgmma.hpp"

namespace cake::kernels {

namespace emu_detail {

inline float bf16_lo(uint32_t x) { return __bfloat162float(__ushort_as_bfloat16(x & 0xffffu)); }
inline float bf16_hi(uint32_t x) { return __bfloat162float(__ushort_as_bfloat16(x >> 16)); }
inline uint32_t pack_bf16(uint16_t lo, uint16_t hi) { return lo | (uint32_t{hi} << 16); }

struct MmaIn {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
};
struct MmaOut {
  float d[4];
};

// D[16 x 8] = A[16 x kK] B[kK x 8] + C, A and B given per lane by `a_at` / `b_at`, summed in
// double and rounded once (the tensor core's order and internal width are not specified; any
// fp32-or-better sum is within the accuracy the tests ask for).
template <int kK, class AAt, class BAt>
void mma_op(MmaIn const* in, MmaOut* out, AAt const& a_at, BAt const& b_at) {
  float A[16][kK], B[kK][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    int const group = lane / 4, quad = lane % 4;
    a_at(in[lane], group, quad, A);
    b_at(in[lane], group, quad, B);
    C[group][2 * quad] = in[lane].c[0];
    C[group][2 * quad + 1] = in[lane].c[1];
    C[group + 8][2 * quad] = in[lane].c[2];
    C[group + 8][2 * quad + 1] = in[lane].c[3];
  }
  float D[16][8];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double sum = C[i][j];
      for (int k = 0; k < kK; ++k) sum += double(A[i][k]) * double(B[k][j]);
      D[i][j] = static_cast<float>(sum);
    }
  for (int lane = 0; lane < 32; ++lane) {
    int const group = lane / 4, quad = lane % 4;
    out[lane].d[0] = D[group][2 * quad];
    out[lane].d[1] = D[group][2 * quad + 1];
    out[lane].d[2] = D[group + 8][2 * quad];
    out[lane].d[3] = D[group + 8][2 * quad + 1];
  }
}

inline void mma_bf16_op(void const* in_v, void* out_v) {
  mma_op<16>(
      static_cast<MmaIn const*>(in_v), static_cast<MmaOut*>(out_v),
      [](MmaIn const& x, int g, int q, float (&A)[16][16]) {
        A[g][2 * q] = bf16_lo(x.a[0]);
        A[g][2 * q + 1] = bf16_hi(x.a[0]);
        A[g + 8][2 * q] = bf16_lo(x.a[1]);
        A[g + 8][2 * q + 1] = bf16_hi(x.a[1]);
        A[g][2 * q + 8] = bf16_lo(x.a[2]);
        A[g][2 * q + 9] = bf16_hi(x.a[2]);
        A[g + 8][2 * q + 8] = bf16_lo(x.a[3]);
        A[g + 8][2 * q + 9] = bf16_hi(x.a[3]);
      },
      [](MmaIn const& x, int g, int q, float (&B)[16][8]) {
        B[2 * q][g] = bf16_lo(x.b[0]);
        B[2 * q + 1][g] = bf16_hi(x.b[0]);
        B[2 * q + 8][g] = bf16_lo(x.b[1]);
        B[2 * q + 9][g] = bf16_hi(x.b[1]);
      });
}

// The tensor cores read a tf32 operand's top 19 bits (sign, exponent, 10 mantissa bits) and
// ignore the low 13, so an operand that is not rounded to tf32 is truncated.
inline float tf32_bits(uint32_t u) { return __builtin_bit_cast(float, u & 0xffffe000u); }

inline void mma_tf32_op(void const* in_v, void* out_v) {
  mma_op<8>(
      static_cast<MmaIn const*>(in_v), static_cast<MmaOut*>(out_v),
      [](MmaIn const& x, int g, int q, float (&A)[16][8]) {
        A[g][q] = tf32_bits(x.a[0]);
        A[g + 8][q] = tf32_bits(x.a[1]);
        A[g][q + 4] = tf32_bits(x.a[2]);
        A[g + 8][q + 4] = tf32_bits(x.a[3]);
      },
      [](MmaIn const& x, int g, int q, float (&B)[8][8]) {
        B[q][g] = tf32_bits(x.b[0]);
        B[q + 4][g] = tf32_bits(x.b[1]);
      });
}

// ldmatrix .x4: lane l's address is row l % 8 of matrix l / 8 (8 bf16 each). Without .trans
// thread t gets (row t / 4, columns 2 (t % 4) + {0, 1}) of each matrix; with .trans (rows
// 2 (t % 4) + {0, 1}, column t / 4).
template <bool kTrans>
void ldmatrix_op(void const* in_v, void* out_v) {
  auto const* rows = static_cast<uint16_t const* const*>(in_v);
  auto* out = static_cast<uint32_t(*)[4]>(out_v);
  for (int t = 0; t < 32; ++t)
    for (int m = 0; m < 4; ++m) {
      uint16_t lo, hi;
      if constexpr (!kTrans) {
        uint16_t const* row = rows[8 * m + t / 4];
        lo = row[2 * (t % 4)];
        hi = row[2 * (t % 4) + 1];
      } else {
        lo = rows[8 * m + 2 * (t % 4)][t / 4];
        hi = rows[8 * m + 2 * (t % 4) + 1][t / 4];
      }
      out[t][m] = pack_bf16(lo, hi);
    }
}

// stmatrix .x4: lane l's address is row l % 8 of matrix l / 8; thread t gives (row t / 4,
// columns 2 (t % 4) + {0, 1}) of each matrix.
struct StmatrixIn {
  uint16_t* row;
  uint32_t r[4];
};
inline void stmatrix_op(void const* in_v, void*) {
  auto const* in = static_cast<StmatrixIn const*>(in_v);
  for (int t = 0; t < 32; ++t)
    for (int m = 0; m < 4; ++m) {
      uint16_t* const row = in[8 * m + t / 4].row;
      row[2 * (t % 4)] = static_cast<uint16_t>(in[t].r[m] & 0xffffu);
      row[2 * (t % 4) + 1] = static_cast<uint16_t>(in[t].r[m] >> 16);
    }
}

}  // namespace emu_detail

inline void mma_m16n8k16_bf16(float (&d)[4], uint32_t const (&a)[4], uint32_t const (&b)[2]) {
  emu_detail::MmaIn in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, d, sizeof in.c);
  auto const out =
      emu::warp_meet<emu_detail::MmaIn, emu_detail::MmaOut>(in, &emu_detail::mma_bf16_op, "mma.bf16");
  std::memcpy(d, out.d, sizeof out.d);
}

inline void mma_m16n8k8_tf32(float (&d)[4], uint32_t const (&a)[4], uint32_t const (&b)[2]) {
  emu_detail::MmaIn in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, d, sizeof in.c);
  auto const out =
      emu::warp_meet<emu_detail::MmaIn, emu_detail::MmaOut>(in, &emu_detail::mma_tf32_op, "mma.tf32");
  std::memcpy(d, out.d, sizeof out.d);
}

// cp.async lands late (emu::cp_async_issue): at the wait_group that completes its group.
inline void cp_async_16(void* smem, void const* gmem, bool valid) {
  emu::cp_async_issue(smem, gmem, 16, valid);
}
inline void cp_async_4(void* smem, void const* gmem, bool valid) {
  emu::cp_async_issue(smem, gmem, 4, valid);
}
inline void cp_async_commit() { emu::cp_async_commit_group(); }
template <int kPending>
void cp_async_wait() {
  emu::cp_async_wait_group(kPending);
}

namespace emu_detail {
struct Frag4 {
  uint32_t r[4];
};
}  // namespace emu_detail

inline void ldmatrix_x4(uint32_t (&r)[4], void const* smem) {
  auto const out = emu::warp_meet<void const*, emu_detail::Frag4>(
      smem, &emu_detail::ldmatrix_op<false>, "ldmatrix");
  std::memcpy(r, out.r, sizeof out.r);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], void const* smem) {
  auto const out = emu::warp_meet<void const*, emu_detail::Frag4>(
      smem, &emu_detail::ldmatrix_op<true>, "ldmatrix.trans");
  std::memcpy(r, out.r, sizeof out.r);
}

inline void stmatrix_x4(void* smem, uint32_t const (&r)[4]) {
  emu_detail::StmatrixIn in{static_cast<uint16_t*>(smem), {r[0], r[1], r[2], r[3]}};
  emu::warp_meet<emu_detail::StmatrixIn, int>(in, &emu_detail::stmatrix_op, "stmatrix");
}

template <int kTransA, int kTransB>
void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  emu::wgmma_issue(32, kTransA != 0, kTransB != 0, d, desc_a, desc_b);
}
template <int kTransA, int kTransB>
void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  emu::wgmma_issue(64, kTransA != 0, kTransB != 0, d, desc_a, desc_b);
}
template <int kTransA, int kTransB>
void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  emu::wgmma_issue(128, kTransA != 0, kTransB != 0, d, desc_a, desc_b);
}

// The compiler already sees the accumulators escape into the emulator at issue and wait; the
// proxy fence orders nothing here (shared memory is plain memory, written in program order), but
// it is a preemption point: it stands between a thread's shared-memory writes and the barrier
// that publishes them.
template <int kN>
void fence_accumulators(float (&)[kN]) {}
inline void fence_proxy_async_shared() { emu::preemption_point(); }

inline void wgmma_fence() { emu::wgmma_fence(); }
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int kPending>
void wgmma_wait() {
  emu::wgmma_wait(kPending);
}

inline void named_barrier_sync(int id, int num_threads) {
  emu::named_barrier(id, num_threads, true);
}
inline void named_barrier_arrive(int id, int num_threads) {
  emu::named_barrier(id, num_threads, false);
}

// No register budget to move on the CPU; the bounds are checked as on the GPU path.
template <int kRegs>
void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256,
                "setmaxnreg: a multiple of 8 in 24 .. 256");
}
template <int kRegs>
void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256,
                "setmaxnreg: a multiple of 8 in 24 .. 256");
}

// threadIdx.x (on the GPU read through a volatile asm, which keeps it inside loops).
inline unsigned thread_index_here() { return threadIdx.x; }

// The emulator runs one grid after another: a dependent grid starts after this one has finished,
// so every flag it waits on must be set by then; an unset one is a missing signal (on the GPU, a
// hang), reported as an error.
inline void launch_dependents() {}
inline void signal_flag(int* flag) {
  __syncthreads();
  if (threadIdx.x == 0) *flag = 1;
}
inline void wait_flag(int const* flag) {
  if (threadIdx.x == 0 && *flag == 0)
    throw std::runtime_error("wait_flag: the flag was never set (the producing grid ran first)");
  __syncthreads();
}

}  // namespace cake::kernels
