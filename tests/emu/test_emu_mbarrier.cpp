// mbarriers and bulk copies on the CPU emulator (emu/runtime.hpp, which kernels/common/ptx.cuh's
// instructions call under CAKE_EMULATE; the 1-D copies and plain arrivals no kernel issues are
// called there directly): a producer thread's
// bulk copies complete a phase that consumer warps wait for, over several phases of two buffers;
// a copy read before its phase completes reads poison; an unswizzled 2-D tensor box lands row by
// row, with zeros outside the tensor; a wait that nothing completes is a deadlock naming the
// barrier; arrivals beyond the count throw; 128-byte swizzled boxes read by wgmma through swizzled
// descriptors (both majors, K across the two 64-column halves) and by ldmatrix.
#include "emu/runtime.hpp"  // first: the CUDA builtins the kernels use, on the CPU

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu/gdn_emu_testing.hpp"
#include "kernels/common/ptx.cuh"
#include "kernels/common/wgmma.cuh"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu::Dim3;
using cake::emu_testing::poisoned;
using namespace cake::kernels;

alignas(1024) char smem_raw[64 * 1024];

constexpr int kRounds = 6;
constexpr int kBytes = 512;  // per round

// Thread 0 produces round r's kBytes into buffer r % 2 (once the consumers freed it); warps 1..3
// wait for it and copy it out. full[b] / empty[b]: the buffer's hand-overs.
__global__ void __launch_bounds__(128) rounds_kernel(char const* src, char* dst) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const bars = reinterpret_cast<uint64_t*>(smem_raw);  // full[2], empty[2]
  char* const buf = smem_raw + 128;
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(&bars[b], 1);
      mbarrier_init(&bars[2 + b], 96);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    if (threadIdx.x != 0) return;
    for (int r = 0; r < kRounds; ++r) {
      int const b = r % 2;
      if (r >= 2) mbarrier_wait(&bars[2 + b], (r / 2 - 1) % 2);
      mbarrier_arrive_expect_tx(&bars[b], kBytes);
      cake::emu::bulk_copy_issue(buf + b * kBytes, {src + r * kBytes, kBytes}, &bars[b]);
    }
    return;
  }
  int const t = threadIdx.x - 32;  // 0 .. 95
  for (int r = 0; r < kRounds; ++r) {
    int const b = r % 2;
    mbarrier_wait(&bars[b], (r / 2) % 2);
    for (int i = t; i < kBytes; i += 96) dst[r * kBytes + i] = buf[b * kBytes + i];
    cake::emu::mbarrier_arrive(&bars[2 + b], 0);
  }
}

TEST(EmulatedMbarrier, BulkCopiesCompletePhasesOverTwoBuffers) {
  std::vector<char> src(kRounds * kBytes);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + i / kBytes);
  for (uint64_t seed : {0ull, 1ull, 2ull, 3ull}) {
    cake::emu::set_schedule(seed, 11);
    std::vector<char> dst(src.size(), 0);
    cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw, [&] { rounds_kernel(src.data(), dst.data()); });
    EXPECT_EQ(dst, src) << "schedule seed " << seed;
  }
}

// Reads the destination right after issuing the copy, before waiting: the bytes are poison.
__global__ void __launch_bounds__(32) early_read_kernel(char const* src, unsigned char* seen) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const bar = reinterpret_cast<uint64_t*>(smem_raw);
  char* const buf = smem_raw + 128;
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_arrive_expect_tx(bar, 64);
    cake::emu::bulk_copy_issue(buf, {src, 64}, bar);
    seen[0] = static_cast<unsigned char>(buf[5]);
    mbarrier_wait(bar, 0);
    seen[1] = static_cast<unsigned char>(buf[5]);
  }
}

TEST(EmulatedMbarrier, ACopyReadBeforeItsPhaseCompletesIsPoison) {
  alignas(16) char src[64];
  for (int i = 0; i < 64; ++i) src[i] = static_cast<char>(i);
  unsigned char seen[2] = {};
  cake::emu::launch(Dim3{1}, Dim3{32}, smem_raw, [&] { early_read_kernel(src, seen); });
  EXPECT_EQ(seen[0], 0xff);
  EXPECT_EQ(seen[1], 5);
}

// A [kRows x 128] bf16 tile of a [T x 128] tensor (rows t0 ..) as two unswizzled 2-D boxes of 64
// columns: element (r, c) lands at ((c / 64) kRows + r) 64 + c % 64; rows past T are zero.
constexpr int kRows = 64;
__global__ void __launch_bounds__(32) tensor_kernel(TensorMap const* map, int t0, bf16* out) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const bar = reinterpret_cast<uint64_t*>(smem_raw);
  auto* const tile = reinterpret_cast<bf16*>(smem_raw + 128);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_arrive_expect_tx(bar, kRows * 128 * 2);
    for (int half = 0; half < 2; ++half)
      tma_load_2d(tile + half * kRows * 64, map, 64 * half, t0, bar);
  }
  __syncwarp();
  mbarrier_wait(bar, 0);
  for (int i = threadIdx.x; i < kRows * 128; i += 32) out[i] = tile[i];
}

TEST(EmulatedMbarrier, TensorBoxLandsDenseWithZerosPastTheEnd) {
  constexpr int kT = 100, kLd = 3 * 128;  // rows of 3 heads; the map covers head 1's columns
  std::vector<bf16> x(kT * kLd);
  for (int t = 0; t < kT; ++t)
    for (int c = 0; c < kLd; ++c) x[t * kLd + c] = __float2bfloat16(float((t * 131 + c) % 251));
  TensorMap map;
  // dims: 128 columns, T rows; stride: a row
  cake::kernels::encode_tensor_map_3d(map, x.data() + 128, 2, {128, kT, 1},
                                      {uint64_t{kLd} * 2, uint64_t{kLd} * 2 * kT}, {64, kRows, 1});
  int const t0 = 37;
  std::vector<bf16> out = poisoned<bf16>(kRows * 128);
  cake::emu::launch(Dim3{1}, Dim3{32}, smem_raw, [&] { tensor_kernel(&map, t0, out.data()); });
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < 128; ++c) {
      float const want = t0 + r < kT ? __bfloat162float(x[(t0 + r) * kLd + 128 + c]) : 0.f;
      EXPECT_EQ(__bfloat162float(out[((c / 64) * kRows + r) * 64 + c % 64]), want)
          << "(" << r << ", " << c << ")";
    }
}

__global__ void __launch_bounds__(32) never_completed_kernel() {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const bar = reinterpret_cast<uint64_t*>(smem_raw);
  if (threadIdx.x == 0) mbarrier_init(bar, 2);
  __syncwarp();
  mbarrier_wait(bar, 0);
}

TEST(EmulatedMbarrier, AWaitNothingCompletesIsADeadlock) {
  try {
    cake::emu::launch(Dim3{1}, Dim3{32}, smem_raw, [] { never_completed_kernel(); });
    FAIL() << "no deadlock reported";
  } catch (std::runtime_error const& e) {
    EXPECT_NE(std::string(e.what()).find("mbarrier"), std::string::npos) << e.what();
  }
}

__global__ void __launch_bounds__(32) extra_arrival_kernel() {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const bar = reinterpret_cast<uint64_t*>(smem_raw);
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_arrive_expect_tx(bar, 16);  // the phase waits for 16 bytes that never come
    cake::emu::mbarrier_arrive(bar, 0);
  }
}

TEST(EmulatedMbarrier, AnArrivalBeyondTheCountThrows) {
  EXPECT_THROW(cake::emu::launch(Dim3{1}, Dim3{32}, smem_raw, [] { extra_arrival_kernel(); }),
               std::runtime_error);
}


// Q, K, X [64 x 128] bf16 (row-major, one head) by 128-byte swizzled boxes of 64 columns (two per
// tile) into swizzled tiles; c1 [64 x 64] = Q K^T (both K-major, K over both halves), c2 [64 x
// 64] = (K^T X)[64 .. 127, 0 .. 63] (both M/N-major), xf [64 x 128] = X's columns 64 .. 127 as
// ldmatrix fragments, written where for_each_wgmma_pair puts them.
__global__ void __launch_bounds__(128) swizzled_kernel(TensorMap const* maps, float* c1, float* c2,
                                                       bf16* xf) {
  extern __shared__ __align__(1024) char smem_raw[];
  auto* const bar = reinterpret_cast<uint64_t*>(smem_raw);
  auto* const tiles = reinterpret_cast<bf16*>(smem_raw + 1024);  // q, k, x: 64 x 128 each
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_arrive_expect_tx(bar, 3 * 64 * 128 * 2);
    for (int t = 0; t < 3; ++t)
      for (int half = 0; half < 2; ++half)
        tma_load_2d(tiles + t * 64 * 128 + half * 64 * 64, &maps[t], 64 * half, 0, bar);
  }
  __syncthreads();
  mbarrier_wait(bar, 0);
  bf16 const* const q = tiles;
  bf16 const* const k = tiles + 64 * 128;
  bf16 const* const x = tiles + 2 * 64 * 128;
  float acc[32] = {};
  warpgroup_mma<64, 128>(KMajorSwizzledTile<64>{q}, KMajorSwizzledTile<64>{k}, 0, 0, acc);
  for_each_wgmma_pair<64>(0, 0, acc, [&](int r, int col, float& x0, float& x1) {
    c1[r * 64 + col] = x0;
    c1[r * 64 + col + 1] = x1;
  });
  float acc2[32] = {};
  warpgroup_mma<64, 64>(MNMajorSwizzledTile<64>{k}, MNMajorSwizzledTile<64>{x}, 64, 0, acc2);
  for_each_wgmma_pair<64>(0, 0, acc2, [&](int r, int col, float& x0, float& x1) {
    c2[r * 64 + col] = x0;
    c2[r * 64 + col + 1] = x1;
  });
  uint32_t frag[16];
  load_swizzled_frag<64, 64>(x, 0, 64, frag);
  int qi = 0;
  for_each_wgmma_pair<64>(0, 64, acc, [&](int r, int col, float&, float&) {
    std::memcpy(xf + r * 128 + col, &frag[qi++], 4);
  });
}

TEST(EmulatedMbarrier, SwizzledBoxesAsWgmmaOperandsAndFragments) {
  std::vector<bf16> x16[3];
  std::vector<double> xd[3];
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < 64 * 128; ++i) {
      float const v = static_cast<float>((i * (7 + 2 * t) + t) % 97) / 97.f - 0.5f;
      x16[t].push_back(__float2bfloat16(v));
      xd[t].push_back(__bfloat162float(x16[t].back()));
    }
  TensorMap maps[3];
  for (int t = 0; t < 3; ++t)
    cake::kernels::encode_tensor_map_3d(maps[t], x16[t].data(), 2, {128, 64, 1}, {256, 256 * 64},
                                        {64, 64, 1}, true);
  std::vector<float> c1 = poisoned<float>(64 * 64), c2 = poisoned<float>(64 * 64);
  std::vector<bf16> xf = poisoned<bf16>(64 * 128);
  cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw,
                    [&] { swizzled_kernel(maps, c1.data(), c2.data(), xf.data()); });
  double e1 = 0, e2 = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 64; ++j) {
      double r1 = 0, r2 = 0;
      for (int d = 0; d < 128; ++d) r1 += xd[0][i * 128 + d] * xd[1][j * 128 + d];
      for (int t = 0; t < 64; ++t) r2 += xd[1][t * 128 + 64 + i] * xd[2][t * 128 + j];
      e1 = std::max(e1, std::abs(c1[i * 64 + j] - r1));
      e2 = std::max(e2, std::abs(c2[i * 64 + j] - r2));
    }
  EXPECT_LT(e1, 1e-4);
  EXPECT_LT(e2, 1e-4);
  for (int r = 0; r < 64; ++r)
    for (int c = 64; c < 128; ++c)
      EXPECT_EQ(__bfloat162float(xf[r * 128 + c]), xd[2][r * 128 + c])
          << "(" << r << ", " << c << ")";
}

}  // namespace
