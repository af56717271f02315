// The instructions of kernels/common/ptx.cuh on the CPU emulator (runtime.hpp): the same
// functions, computed from the fragment layouts that ptx.cuh documents (PTX ISA, "Matrix Fragments
// for mma.m16n8k16" / "m16n8k8", and ldmatrix). Warp-wide instructions meet the warp's 32 lanes;
// wgmma meets the warpgroup's 128 threads (emu/wgmma.hpp); named barriers are the runtime's.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu/runtime.hpp"
#include "emu/wgmma.hpp"
#include "kernels/common/tensor_map.hpp"

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
  auto const out = emu::warp_meet<emu_detail::MmaIn, emu_detail::MmaOut>(
      in, &emu_detail::mma_bf16_op, "mma.bf16");
  std::memcpy(d, out.d, sizeof out.d);
}

inline void mma_m16n8k8_tf32(float (&d)[4], uint32_t const (&a)[4], uint32_t const (&b)[2]) {
  emu_detail::MmaIn in;
  std::memcpy(in.a, a, sizeof in.a);
  std::memcpy(in.b, b, sizeof in.b);
  std::memcpy(in.c, d, sizeof in.c);
  auto const out = emu::warp_meet<emu_detail::MmaIn, emu_detail::MmaOut>(
      in, &emu_detail::mma_tf32_op, "mma.tf32");
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
// An L2 prefetch moves nothing the emulator models; it reads the byte, so that an address outside
// the buffers is at least touched here.
inline void prefetch_l2(void const* p) {
  volatile unsigned char sink = *static_cast<unsigned char const*>(p);
  (void)sink;
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

inline void mbarrier_init(uint64_t* bar, int count) { emu::mbarrier_init(bar, count); }
inline void mbarrier_init_fence() {}
inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
  emu::mbarrier_arrive(bar, tx_bytes);
}
inline void mbarrier_wait(uint64_t* bar, int parity) { emu::mbarrier_wait(bar, parity); }


// The emulator's tensor map (emu::encode_tensor_map_3d writes it into TensorMap's bytes).
struct EmuTensorMap3d {
  char const* base;
  int elem_bytes;
  uint64_t dims[3];     // elements, innermost first
  uint64_t strides[3];  // bytes; strides[0] = elem_bytes
  uint32_t box[3];
  bool swizzle128;  // CU_TENSOR_MAP_SWIZZLE_128B: box rows of 128 bytes, 16-byte chunks XOR row % 8
};
static_assert(sizeof(EmuTensorMap3d) <= sizeof(TensorMap));

// The host's side: a 3-D tiled map of the tensor at base (dims innermost first, in elements;
// strides of dims 1 and 2 in bytes), copied in boxes of `box` elements (cuTensorMapEncodeTiled's
// arguments, without interleave, swizzle, L2 promotion or fill options: tile mode, zero fill).
inline void encode_tensor_map_3d(TensorMap& map, void const* base, int elem_bytes,
                                 uint64_t const (&dims)[3], uint64_t const (&strides)[2],
                                 uint32_t const (&box)[3], bool swizzle128 = false) {
  if (swizzle128 && box[0] * elem_bytes != 128)
    throw std::invalid_argument("emulator: a 128-byte swizzled box has rows of 128 bytes");
  EmuTensorMap3d const m{static_cast<char const*>(base),
                         elem_bytes,
                         {dims[0], dims[1], dims[2]},
                         {uint64_t(elem_bytes), strides[0], strides[1]},
                         {box[0], box[1], box[2]},
                         swizzle128};
  std::memset(map.bytes, 0, sizeof map.bytes);
  std::memcpy(map.bytes, &m, sizeof m);
}

// For each element of the box of m at (c0, c1, c2), in the box's dense order (innermost first):
// f(at, inside) with at its address in the tensor, inside whether it lies within the dims.
template <class F>
void for_each_box_element(EmuTensorMap3d const& m, int c0, int c1, int c2, F const& f) {
  int const c[3] = {c0, c1, c2};
  for (uint32_t i2 = 0; i2 < m.box[2]; ++i2)
    for (uint32_t i1 = 0; i1 < m.box[1]; ++i1)
      for (uint32_t i0 = 0; i0 < m.box[0]; ++i0) {
        int64_t const x[3] = {int64_t{c[0]} + i0, int64_t{c[1]} + i1, int64_t{c[2]} + i2};
        bool inside = true;
        for (int d = 0; d < 3; ++d) inside = inside && x[d] >= 0 && x[d] < int64_t(m.dims[d]);
        f(const_cast<char*>(m.base) + x[0] * m.strides[0] + x[1] * m.strides[1] +
              x[2] * m.strides[2],
          inside);
      }
}

inline void tma_load_box(void* dst, TensorMap const* map, int c0, int c1, int c2, uint64_t* bar) {
  if (reinterpret_cast<uintptr_t>(dst) % 128 != 0)
    throw std::runtime_error("emulator: a tensor copy's destination must be 128-byte aligned");
  EmuTensorMap3d m;
  std::memcpy(&m, map->bytes, sizeof m);
  std::vector<char> box(size_t{m.box[0]} * m.box[1] * m.box[2] * m.elem_bytes, 0);
  char* out = box.data();
  for_each_box_element(m, c0, c1, c2, [&](char const* at, bool inside) {
    if (inside) std::memcpy(out, at, m.elem_bytes);
    out += m.elem_bytes;
  });
  if (m.swizzle128) {
    if (reinterpret_cast<uintptr_t>(dst) % 1024 != 0)
      throw std::runtime_error("emulator: a 128-byte swizzled box lands 1024-byte aligned");
    std::vector<char> swizzled(box.size());
    for (size_t o = 0; o < box.size(); o += 16)
      std::memcpy(swizzled.data() + (o ^ ((o >> 7 & 7) << 4)), box.data() + o, 16);
    box.swap(swizzled);
  }
  emu::bulk_copy_issue(dst, box, bar);
}
// The bulk copy lands as a tensor copy does (emu::bulk_copy_issue); the alignment the GPU needs
// is checked.
inline void bulk_load(void* dst, void const* src, uint32_t bytes, uint64_t* bar) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 ||
      bytes % 16 != 0 || bytes == 0)
    throw std::runtime_error("emulator: a bulk copy is 16-byte aligned, a multiple of 16 bytes");
  emu::bulk_copy_issue(dst, {static_cast<char const*>(src), bytes}, bar);
}
inline void tma_load_2d(void* dst, TensorMap const* map, int c0, int c1, uint64_t* bar) {
  tma_load_box(dst, map, c0, c1, 0, bar);
}
inline void tma_load_3d(void* dst, TensorMap const* map, int c0, int c1, int c2, uint64_t* bar) {
  tma_load_box(dst, map, c0, c1, c2, bar);
}

// The box of `map` at (c0, c1, c2) from shared memory at src (laid out as a load of the box lands
// it), into the tensor's elements inside its dims: src read and the tensor written at the waits
// emu::bulk_store_issue describes.
inline void tma_store_3d(TensorMap const* map, void const* src, int c0, int c1, int c2) {
  emu::shared_address(src);  // throws unless the source is in the block's shared memory
  EmuTensorMap3d m;
  std::memcpy(&m, map->bytes, sizeof m);
  if (reinterpret_cast<uintptr_t>(src) % (m.swizzle128 ? 1024 : 128) != 0)
    throw std::runtime_error(
        "emulator: a tensor store's source is 128-byte (swizzled: 1024) aligned");
  emu::bulk_store_issue([m, src, c0, c1, c2]() -> emu::BulkStoreWrite {
    size_t const bytes = size_t{m.box[0]} * m.box[1] * m.box[2] * m.elem_bytes;
    std::vector<char> box(static_cast<char const*>(src), static_cast<char const*>(src) + bytes);
    if (m.swizzle128) {
      std::vector<char> plain(bytes);
      for (size_t o = 0; o < bytes; o += 16)
        std::memcpy(plain.data() + o, box.data() + (o ^ ((o >> 7 & 7) << 4)), 16);
      box.swap(plain);
    }
    return [m, c0, c1, c2, box = std::move(box)] {
      char const* in = box.data();
      for_each_box_element(m, c0, c1, c2, [&](char* at, bool inside) {
        if (inside) std::memcpy(at, in, m.elem_bytes);
        in += m.elem_bytes;
      });
    };
  });
}
inline void bulk_commit_group() { emu::bulk_store_commit_group(); }
template <int kPending>
void bulk_wait_group_read() {
  emu::bulk_store_wait_group(kPending, true);
}
template <int kPending>
void bulk_wait_group() {
  emu::bulk_store_wait_group(kPending, false);
}
inline void fence_proxy_async_global() {}

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
inline void signal_flag(int* flag, int share) {
  __syncthreads();
  if (threadIdx.x == 0) *flag += share;
}
inline void wait_flag(int const* flag, int total) {
  if (threadIdx.x == 0 && *flag < total)
    throw std::runtime_error("wait_flag: the flag is " + std::to_string(*flag) + ", not " +
                             std::to_string(total) + " (the producing grid ran first)");
  __syncthreads();
}

// The ordered reduction (ptx.cuh): blocks run in order here, so a ticket is the block's place in
// that order and every turn a block waits on has been passed by a block before it; a turn not yet
// there is a wait that could outlast its producer on the GPU, reported as an error.
inline int take_ticket(int* counter) { return (*counter)++; }
inline void reduce_add_f32x2(float* addr, float x, float y) {
  addr[0] += x;
  addr[1] += y;
}
inline void wait_turn(int const* turn, int value) {
  if (*turn != value)
    throw std::runtime_error("wait_turn: the turn is " + std::to_string(*turn) + ", not " +
                             std::to_string(value) + " (a block before this one did not pass it)");
}
inline void pass_turn(int* turn, int value) { *turn = value; }

}  // namespace cake::kernels
