// The wgmma building blocks (kernels/common/wgmma.cuh) and the warp-specialisation barriers
// (kernels/common/ptx.cuh) on the CPU emulator, in small kernels written as cake's are.
// Products: blocked tiles loaded by load_tile_blocked_async, descriptors of KMajorTile /
// MNMajorTile, warpgroup_mma and for_each_wgmma_pair's accumulator layout, for every width,
// every pair of operand majors, a column offset into B, K = 64 and 128, and two warpgroups each
// doing its own 64 rows; against a double-precision product of the same bf16 values (the
// emulator sums in double and rounds once per wgmma: relative errors ~1e-7, a layout mistake
// gives errors of order 1). Asynchrony: an operand or an accumulator written between issue and
// wait throws; wait_group<1> completes the older of two groups and only it. Named barriers: a
// producer warp and four consumer warps over two buffers; a barrier that cannot complete throws
// instead of hanging; a producer warpgroup feeding a consumer warpgroup's wgmma. Outputs are
// poisoned (NaN), shared memory too (emu::launch).
#include "emu/runtime.hpp"  // first: the CUDA builtins the kernels use, on the CPU

#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "emu/gdn_emu_testing.hpp"
#include "kernels/common/wgmma.cuh"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu::Dim3;
using cake::emu_testing::poisoned;
using namespace cake::kernels;

constexpr int kM = 64;       // rows of A and C: one warpgroup
constexpr int kBCols = 128;  // columns of B; a product uses kN of them from kN0

// The kernels' dynamic shared memory (their `extern __shared__ smem_raw`), one block at a time:
// the largest is four 64 x 128 bf16 tiles.
alignas(128) char smem_raw[4 * 64 * 128 * sizeof(bf16)];

// C [64 x kN] = A B[:, kN0 .. kN0 + kN): A [64 x kKd] stored K-major ([M][K]) or M-major
// ([K][M]), B [kKd x 128] stored K-major ([N][K]) or N-major ([K][N]).
template <int kN, int kN0, int kKd, bool kAKMajor, bool kBKMajor>
__global__ void __launch_bounds__(128) product_kernel(bf16 const* a, bf16 const* b, float* c) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const sa = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sb = sa + kM * kKd;
  if constexpr (kAKMajor)
    load_tile_blocked_async<kM, kKd, 128>(sa, a, kKd, kM, threadIdx.x);
  else
    load_tile_blocked_async<kKd, kM, 128>(sa, a, kM, kKd, threadIdx.x);
  if constexpr (kBKMajor)
    load_tile_blocked_async<kBCols, kKd, 128>(sb, b, kKd, kBCols, threadIdx.x);
  else
    load_tile_blocked_async<kKd, kBCols, 128>(sb, b, kBCols, kKd, threadIdx.x);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();
  using A = std::conditional_t<kAKMajor, KMajorTile<kKd>, MNMajorTile<kM>>;
  using B = std::conditional_t<kBKMajor, KMajorTile<kKd>, MNMajorTile<kBCols>>;
  float acc[kN / 2] = {};
  warpgroup_mma<kN, kKd>(A{sa}, B{sb}, 0, kN0, acc);
  for_each_wgmma_pair<kN>(0, 0, acc, [&](int r, int col, float& c0, float& c1) {
    c[r * kN + col] = c0;
    c[r * kN + col + 1] = c1;
  });
}

// C [128 x 128] = A1 B1 + A2 B2, A1, A2 [128 x 64] M-major (stored [K][M]) and B1, B2 [64 x 128]
// N-major (stored [K][N]); warpgroup g computes rows 64 g .. 64 g + 63, both products in one
// wgmma group.
__global__ void __launch_bounds__(256)
    two_warpgroups_kernel(bf16 const* a1, bf16 const* b1, bf16 const* a2, bf16 const* b2,
                          float* c) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const tiles = reinterpret_cast<bf16*>(smem_raw);  // a1, b1, a2, b2: [64 x 128] each
  bf16 const* const src[4] = {a1, b1, a2, b2};
  for (int i = 0; i < 4; ++i)
    load_tile_blocked_async<64, 128, 256>(tiles + i * 64 * 128, src[i], 128, 64, threadIdx.x);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();
  int const m0 = 64 * (threadIdx.x / 128);
  float acc[64] = {};
  fence_accumulators(acc);
  wgmma_fence();
  warpgroup_mma_async<128, 64>(MNMajorTile<128>{tiles}, MNMajorTile<128>{tiles + 64 * 128}, m0, 0,
                               acc);
  warpgroup_mma_async<128, 64>(MNMajorTile<128>{tiles + 2 * 64 * 128},
                               MNMajorTile<128>{tiles + 3 * 64 * 128}, m0, 0, acc);
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(acc);
  for_each_wgmma_pair<128>(m0, 0, acc, [&](int r, int col, float& c0, float& c1) {
    c[r * 128 + col] = c0;
    c[r * 128 + col + 1] = c1;
  });
}

// Random bf16 values (normal), and the same as doubles.
std::vector<bf16> random_bf16(size_t n, std::mt19937& rng, std::vector<double>& as_double) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<bf16> x(n);
  as_double.resize(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = __float2bfloat16(normal(rng));
    as_double[i] = __bfloat162float(x[i]);
  }
  return x;
}

// max |got - ref| / max |ref|, infinite if any got is not finite.
double relative_error(std::vector<float> const& got, std::vector<double> const& ref) {
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_err = std::isfinite(got[i]) ? std::fmax(max_err, std::fabs(got[i] - ref[i])) : INFINITY;
    max_ref = std::fmax(max_ref, std::fabs(ref[i]));
  }
  return max_err / max_ref;
}

// Exact up to fp32 rounding of the kKd / 16 partial sums.
constexpr double kTolerance = 1e-5;

// C = A B for logical A[m][k] (kM x kd) and B[k][n] (kd x b_cols), columns n0 .. n0 + n.
std::vector<double> product(std::vector<double> const& a, std::vector<double> const& b, int kd,
                            int b_cols, int n0, int n) {
  std::vector<double> c(kM * n, 0.0);
  for (int m = 0; m < kM; ++m)
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < kd; ++k) c[m * n + j] += a[m * kd + k] * b[k * b_cols + n0 + j];
  return c;
}

// Stored in the major the kernel loads: element (r, c) of a logical [rows x cols] matrix at
// r * cols + c (row-major) or c * rows + r (transposed).
std::vector<bf16> stored(std::vector<bf16> const& x, int rows, int cols, bool row_major) {
  std::vector<bf16> out(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[row_major ? r * cols + c : c * rows + r] = x[r * cols + c];
  return out;
}

template <int kN, int kN0, int kKd, bool kAKMajor, bool kBKMajor>
void check_product(std::mt19937& rng) {
  SCOPED_TRACE("wgmma 64x" + std::to_string(kN) + "x" + std::to_string(kKd) + ", A " +
               (kAKMajor ? "K" : "M") + "-major, B " + (kBKMajor ? "K" : "N") +
               "-major, B columns from " + std::to_string(kN0));
  std::vector<double> a, b;  // logical A [64 x kKd], B [kKd x 128]
  std::vector<bf16> const a16 = random_bf16(kM * kKd, rng, a),
                          b16 = random_bf16(kKd * kBCols, rng, b);
  // A K-major is A row-major; B K-major is B^T row-major.
  std::vector<bf16> const a_src = stored(a16, kM, kKd, kAKMajor);
  std::vector<bf16> const b_src = stored(b16, kKd, kBCols, !kBKMajor);
  std::vector<float> c = poisoned<float>(kM * kN);
  cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw, [&] {
    product_kernel<kN, kN0, kKd, kAKMajor, kBKMajor>(a_src.data(), b_src.data(), c.data());
  });
  EXPECT_LT(relative_error(c, product(a, b, kKd, kBCols, kN0, kN)), kTolerance);
}

TEST(EmulatedWgmma, ProductsMatchDouble) {
  std::mt19937 rng(std::random_device{}());
  check_product<32, 32, 128, true, true>(rng);
  check_product<32, 96, 64, true, false>(rng);
  check_product<32, 0, 128, false, true>(rng);
  check_product<32, 64, 64, false, false>(rng);
  check_product<64, 0, 128, true, true>(rng);
  check_product<64, 64, 64, true, false>(rng);
  check_product<64, 64, 128, false, true>(rng);
  check_product<64, 0, 64, false, false>(rng);
  check_product<128, 0, 64, true, true>(rng);
  check_product<128, 0, 128, true, false>(rng);
  check_product<128, 0, 64, false, true>(rng);
  check_product<128, 0, 128, false, false>(rng);
}

TEST(EmulatedWgmma, TwoWarpgroupsSplitRows) {
  std::mt19937 rng(std::random_device{}());
  constexpr int kTile = 64 * 128;
  std::vector<double> x;  // a1, b1, a2, b2 as stored: [64 (K) x 128] each
  std::vector<bf16> const x16 = random_bf16(4 * kTile, rng, x);
  std::vector<float> c = poisoned<float>(128 * 128);
  cake::emu::launch(Dim3{1}, Dim3{256}, smem_raw, [&] {
    two_warpgroups_kernel(x16.data(), x16.data() + kTile, x16.data() + 2 * kTile,
                          x16.data() + 3 * kTile, c.data());
  });
  std::vector<double> ref(128 * 128, 0.0);  // sum_k a1[k][m] b1[k][n] + a2[k][m] b2[k][n]
  for (int m = 0; m < 128; ++m)
    for (int n = 0; n < 128; ++n)
      for (int k = 0; k < 64; ++k)
        ref[m * 128 + n] += x[k * 128 + m] * x[kTile + k * 128 + n] +
                            x[2 * kTile + k * 128 + m] * x[3 * kTile + k * 128 + n];
  EXPECT_LT(relative_error(c, ref), kTolerance);
}

// Fragments (load_blocked_frag / store_blocked_acc, by ldmatrix and stmatrix): two warpgroups,
// warpgroup g storing its accumulator (values x[r][c] laid out by for_each_wgmma_pair) into rows
// 64 g .. 64 g + 63, columns 32 .. 95 of a blocked [128 x 128] tile; then each warpgroup loads
// columns 64 .. 127 of its rows back as a fragment. out1 <- the tile (row-major, by
// blocked_offset), out2 <- the fragment's pairs where for_each_wgmma_pair puts them.
__global__ void __launch_bounds__(256) fragment_kernel(float const* x, bf16* out1, bf16* out2) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const tile = reinterpret_cast<bf16*>(smem_raw);
  int const m0 = 64 * (threadIdx.x / 128);
  float acc[32];
  for_each_wgmma_pair<64>(m0, 32, acc, [&](int r, int col, float& c0, float& c1) {
    c0 = x[r * 128 + col];
    c1 = x[r * 128 + col + 1];
  });
  store_blocked_acc<128, 64>(tile, m0, 32, acc);
  __syncthreads();
  for (int i = threadIdx.x; i < 128 * 128; i += 256)
    out1[i] = tile[blocked_offset<128>(i / 128, i % 128)];
  uint32_t frag[16];
  load_blocked_frag<128, 64>(tile, m0, 64, frag);
  int q = 0;
  for_each_wgmma_pair<64>(m0, 64, acc, [&](int r, int col, float&, float&) {
    *reinterpret_cast<uint32_t*>(out2 + r * 128 + col) = frag[q++];
  });
}

TEST(EmulatedWgmma, FragmentsStoreAndLoadTheAccumulatorLayout) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(128 * 128);
  for (float& v : x) v = normal(rng);
  std::vector<bf16> out1 = poisoned<bf16>(128 * 128);
  std::vector<bf16> out2 = poisoned<bf16>(128 * 128);
  cake::emu::launch(Dim3{1}, Dim3{256}, smem_raw,
                    [&] { fragment_kernel(x.data(), out1.data(), out2.data()); });
  int stored = 0, loaded = 0;
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < 128; ++c) {
      float const want = __bfloat162float(__float2bfloat16(x[r * 128 + c]));
      float const got1 = __bfloat162float(out1[r * 128 + c]);
      float const got2 = __bfloat162float(out2[r * 128 + c]);
      if (c >= 32 && c < 96) {
        EXPECT_EQ(got1, want) << "stored (" << r << ", " << c << ")";
        stored += got1 == want;
      }
      if (c >= 64 && c < 96) {  // written by the store, read back
        EXPECT_EQ(got2, want) << "loaded (" << r << ", " << c << ")";
        loaded += got2 == want;
      }
      if (c >= 96) EXPECT_TRUE(std::isnan(got2)) << "loaded (" << r << ", " << c << ")";
    }
  EXPECT_EQ(stored, 128 * 64);
  EXPECT_EQ(loaded, 128 * 32);
}

// Warp specialisation as the next kernels do it: warpgroup 0 (the producer, its register budget
// lowered) loads A [64 x 64] K-major (stored [M][K]) and B [64 x 64] N-major (stored [K][N]) and
// arrives at barrier 1; warpgroup 1 (the consumer, its budget raised) syncs on it and computes
// C = A B.
__global__ void __launch_bounds__(256, 1)
    specialised_kernel(bf16 const* a, bf16 const* b, float* c) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const sa = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sb = sa + 64 * 64;
  if (threadIdx.x < 128) {
    setmaxnreg_dec<40>();
    load_tile_blocked_async<64, 64, 128>(sa, a, 64, 64, threadIdx.x);
    load_tile_blocked_async<64, 64, 128>(sb, b, 64, 64, threadIdx.x);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();
    named_barrier_arrive(1, 256);
    return;
  }
  setmaxnreg_inc<232>();
  named_barrier_sync(1, 256);
  float acc[32] = {};
  warpgroup_mma<64, 64>(KMajorTile<64>{sa}, MNMajorTile<64>{sb}, 0, 0, acc);
  for_each_wgmma_pair<64>(0, 0, acc, [&](int r, int col, float& c0, float& c1) {
    c[r * 64 + col] = c0;
    c[r * 64 + col + 1] = c1;
  });
}

TEST(EmulatedWgmma, ProducerWarpgroupFeedsConsumerWarpgroup) {
  std::mt19937 rng(std::random_device{}());
  std::vector<double> a, b;  // logical A [64 x 64], B [64 x 64], both stored row-major
  std::vector<bf16> const a16 = random_bf16(64 * 64, rng, a), b16 = random_bf16(64 * 64, rng, b);
  std::vector<float> c = poisoned<float>(64 * 64);
  cake::emu::launch(Dim3{1}, Dim3{256}, smem_raw,
                    [&] { specialised_kernel(a16.data(), b16.data(), c.data()); });
  EXPECT_LT(relative_error(c, product(a, b, 64, 64, 0, 64)), kTolerance);
}

// The message of what `run` throws, empty if nothing.
std::string error_of(std::function<void()> const& run) {
  try {
    run();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "";
}

// What a thread does between a group's commit and its wait.
enum class Touch { kNothing, kOtherShared, kOperand, kAccumulator };

// C [64 x 64] = A B, A and B [64 x 64] K-major (stored [M][K], [N][K]), one group; thread 5
// does `kTouch` while the group is in flight.
template <Touch kTouch>
__global__ void __launch_bounds__(128) touch_kernel(bf16 const* a, bf16 const* b, float* c) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const sa = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sb = sa + 64 * 64;
  bf16* const spare = sb + 64 * 64;  // read by no product
  load_tile_blocked_async<64, 64, 128>(sa, a, 64, 64, threadIdx.x);
  load_tile_blocked_async<64, 64, 128>(sb, b, 64, 64, threadIdx.x);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();
  float acc[32] = {};
  fence_accumulators(acc);
  wgmma_fence();
  warpgroup_mma_async<64, 64>(KMajorTile<64>{sa}, KMajorTile<64>{sb}, 0, 0, acc);
  wgmma_commit();
  if (threadIdx.x == 5) {
    if constexpr (kTouch == Touch::kOtherShared) spare[0] = __float2bfloat16(1.f);
    if constexpr (kTouch == Touch::kOperand)
      sb[blocked_offset<64>(37, 50)] =
          __float2bfloat16(__bfloat162float(sb[blocked_offset<64>(37, 50)]) + 1.f);
    if constexpr (kTouch == Touch::kAccumulator) acc[3] = 1.f;
  }
  wgmma_wait<0>();
  fence_accumulators(acc);
  for_each_wgmma_pair<64>(0, 0, acc, [&](int r, int col, float& c0, float& c1) {
    c[r * 64 + col] = c0;
    c[r * 64 + col + 1] = c1;
  });
}

template <Touch kTouch>
std::string run_touch(std::mt19937& rng, bool expect_correct) {
  std::vector<double> a, b;  // logical A [64 x 64], B^T [64 x 64] (stored [N][K])
  std::vector<bf16> const a16 = random_bf16(64 * 64, rng, a), b16 = random_bf16(64 * 64, rng, b);
  std::vector<float> c = poisoned<float>(64 * 64);
  std::string const error = error_of([&] {
    cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw,
                      [&] { touch_kernel<kTouch>(a16.data(), b16.data(), c.data()); });
  });
  if (expect_correct) {
    std::vector<double> bt(64 * 64);  // B [k][n] from B^T [n][k]
    for (int n = 0; n < 64; ++n)
      for (int k = 0; k < 64; ++k) bt[k * 64 + n] = b[n * 64 + k];
    EXPECT_LT(relative_error(c, product(a, bt, 64, 64, 0, 64)), kTolerance);
  }
  return error;
}

TEST(EmulatedWgmma, SharedWritesOutsideTheOperandsAreAllowed) {
  std::mt19937 rng(std::random_device{}());
  EXPECT_EQ(run_touch<Touch::kNothing>(rng, true), "");
  EXPECT_EQ(run_touch<Touch::kOtherShared>(rng, true), "");
}

TEST(EmulatedWgmma, OperandChangedBeforeWaitThrows) {
  std::mt19937 rng(std::random_device{}());
  std::string const error = run_touch<Touch::kOperand>(rng, false);
  EXPECT_NE(error.find("wgmma operand in shared memory changed before wait_group"),
            std::string::npos)
      << error;
  // B [n][k] = (37, 50): the fourth wgmma (k 48 .. 63) of the product reads it.
  EXPECT_NE(error.find("B element (mn 37, k 2 of its 16)"), std::string::npos) << error;
}

TEST(EmulatedWgmma, AccumulatorWrittenBeforeWaitThrows) {
  std::mt19937 rng(std::random_device{}());
  std::string const error = run_touch<Touch::kAccumulator>(rng, false);
  EXPECT_NE(error.find("wgmma accumulators changed before wait_group: thread 5"), std::string::npos)
      << error;
}

// What a thread does after wait_group<1> with two groups committed.
enum class AfterWaitOne { kReuseOlderOperands, kTouchNewerOperand };

// Group 1: C1 = A1 B1, then group 2: C2 = A2 B2 (64 x 64 x 64 each, K-major, from x: a1, b1, a2,
// b2 stored [64][64] each). wait_group<1> completes group 1 only: C1 is stored, then `kAfter`,
// then wait_group<0> and C2.
template <AfterWaitOne kAfter>
__global__ void __launch_bounds__(128) wait_one_kernel(bf16 const* x, float* c1, float* c2) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const tiles = reinterpret_cast<bf16*>(smem_raw);
  for (int i = 0; i < 4; ++i)
    load_tile_blocked_async<64, 64, 128>(tiles + i * 64 * 64, x + i * 64 * 64, 64, 64, threadIdx.x);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();
  float acc1[32] = {}, acc2[32] = {};
  fence_accumulators(acc1);
  fence_accumulators(acc2);
  wgmma_fence();
  warpgroup_mma_async<64, 64>(KMajorTile<64>{tiles}, KMajorTile<64>{tiles + 64 * 64}, 0, 0, acc1);
  wgmma_commit();
  warpgroup_mma_async<64, 64>(KMajorTile<64>{tiles + 2 * 64 * 64},
                              KMajorTile<64>{tiles + 3 * 64 * 64}, 0, 0, acc2);
  wgmma_commit();
  wgmma_wait<1>();
  fence_accumulators(acc1);
  for_each_wgmma_pair<64>(0, 0, acc1, [&](int r, int col, float& d0, float& d1) {
    c1[r * 64 + col] = d0;
    c1[r * 64 + col + 1] = d1;
  });
  if constexpr (kAfter == AfterWaitOne::kReuseOlderOperands)
    for (int i = threadIdx.x; i < 2 * 64 * 64; i += 128) tiles[i] = __float2bfloat16(0.f);
  if constexpr (kAfter == AfterWaitOne::kTouchNewerOperand)
    if (threadIdx.x == 0)
      tiles[2 * 64 * 64] = __float2bfloat16(__bfloat162float(tiles[2 * 64 * 64]) + 1.f);
  wgmma_wait<0>();
  fence_accumulators(acc2);
  for_each_wgmma_pair<64>(0, 0, acc2, [&](int r, int col, float& d0, float& d1) {
    c2[r * 64 + col] = d0;
    c2[r * 64 + col + 1] = d1;
  });
}

// C = A B^T for A, B^T stored [64][64] at a, b (K-major both).
std::vector<double> product_bt(double const* a, double const* b) {
  std::vector<double> c(64 * 64, 0.0);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n)
      for (int k = 0; k < 64; ++k) c[m * 64 + n] += a[m * 64 + k] * b[n * 64 + k];
  return c;
}

TEST(EmulatedWgmma, WaitGroupOneCompletesTheOlderGroupOnly) {
  std::mt19937 rng(std::random_device{}());
  std::vector<double> x;
  std::vector<bf16> const x16 = random_bf16(4 * 64 * 64, rng, x);
  std::vector<float> c1 = poisoned<float>(64 * 64), c2 = poisoned<float>(64 * 64);
  // The older group's operands may be overwritten after wait_group<1>; both products are right.
  EXPECT_EQ(error_of([&] {
              cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw, [&] {
                wait_one_kernel<AfterWaitOne::kReuseOlderOperands>(x16.data(), c1.data(),
                                                                   c2.data());
              });
            }),
            "");
  EXPECT_LT(relative_error(c1, product_bt(x.data(), x.data() + 64 * 64)), kTolerance);
  EXPECT_LT(relative_error(c2, product_bt(x.data() + 2 * 64 * 64, x.data() + 3 * 64 * 64)),
            kTolerance);
  // The newer group is still in flight after wait_group<1>: its operands may not be.
  std::string const error = error_of([&] {
    cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw, [&] {
      wait_one_kernel<AfterWaitOne::kTouchNewerOperand>(x16.data(), c1.data(), c2.data());
    });
  });
  EXPECT_NE(
      error.find("wgmma operand in shared memory changed before wait_group: A element (mn 0, k 0"),
      std::string::npos)
      << error;
}

// Issues and commits a product but never waits for it.
__global__ void __launch_bounds__(128) no_wait_kernel() {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const tile = reinterpret_cast<bf16*>(smem_raw);
  float acc[16] = {};
  wgmma_fence();
  warpgroup_mma_async<32, 16>(KMajorTile<16>{tile}, MNMajorTile<32>{tile}, 0, 0, acc);
  wgmma_commit();
}

TEST(EmulatedWgmma, ExitWithAProductInFlightThrows) {
  std::string const error =
      error_of([] { cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw, [] { no_wait_kernel(); }); });
  EXPECT_NE(error.find("warpgroup 0 of block (0, 0) exited with asynchronous operations in flight"),
            std::string::npos)
      << error;
}

// Warp 3 leaves before the warpgroup's product: the others wait at wgmma.fence forever.
__global__ void __launch_bounds__(128) missing_warp_kernel() {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const tile = reinterpret_cast<bf16*>(smem_raw);
  if (threadIdx.x >= 96) return;
  float acc[16] = {};
  warpgroup_mma<32, 16>(KMajorTile<16>{tile}, MNMajorTile<32>{tile}, 0, 0, acc);
}

TEST(EmulatedWgmma, MissingWarpIsADeadlock) {
  std::string const error = error_of(
      [] { cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw, [] { missing_warp_kernel(); }); });
  EXPECT_NE(error.find("deadlock"), std::string::npos) << error;
  EXPECT_NE(error.find("warpgroup 0: 96 threads at wgmma.fence"), std::string::npos) << error;
}

TEST(EmulatedWgmma, SwizzledDescriptorThrows) {
  std::string const error = error_of([] {
    cake::emu::launch(Dim3{1}, Dim3{128}, smem_raw, [] {
      float acc[32] = {};
      uint64_t const desc = wgmma_descriptor(smem_raw, 128, 1024);
      wgmma_fence();
      wgmma_m64n64k16_bf16<0, 0>(acc, desc | uint64_t{2} << 62, desc);
    });
  });
  EXPECT_NE(error.find("swizzle mode 2"), std::string::npos) << error;
}

// Producer / consumer over two shared buffers of 128 floats, kRounds rounds: warp 0 fills buffer
// s = round % 2 with round r of x and arrives at barrier "full" 1 + s; warps 1-4 sync on it, write
// y = 2 x, and arrive at "empty" 3 + s, which the producer syncs on before refilling the buffer.
constexpr int kRounds = 6;
constexpr int kPipelineThreads = 160;

__global__ void __launch_bounds__(kPipelineThreads) pipeline_kernel(float const* x, float* y) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const buf = reinterpret_cast<float*>(smem_raw);  // [2][128]
  if (threadIdx.x < 32) {
    for (int r = 0; r < kRounds; ++r) {
      int const s = r % 2;
      if (r >= 2) named_barrier_sync(3 + s, kPipelineThreads);
      // A warp collective: on the emulator the consumers run before the buffer is filled, so
      // that one reading before its barrier would read poison.
      __syncwarp();
      for (int i = threadIdx.x; i < 128; i += 32) buf[s * 128 + i] = x[r * 128 + i];
      named_barrier_arrive(1 + s, kPipelineThreads);
    }
  } else {
    int const t = threadIdx.x - 32;
    for (int r = 0; r < kRounds; ++r) {
      int const s = r % 2;
      named_barrier_sync(1 + s, kPipelineThreads);
      y[r * 128 + t] = 2.f * buf[s * 128 + (t + 32 * r) % 128];
      named_barrier_arrive(3 + s, kPipelineThreads);
    }
  }
}

TEST(EmulatedBarrier, ProducerConsumerRounds) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(kRounds * 128);
  for (float& v : x) v = normal(rng);
  std::vector<float> y = poisoned<float>(kRounds * 128);
  cake::emu::launch(Dim3{2}, Dim3{kPipelineThreads}, smem_raw,
                    [&] { pipeline_kernel(x.data(), y.data()); });
  for (int r = 0; r < kRounds; ++r)
    for (int t = 0; t < 128; ++t)
      EXPECT_EQ(y[r * 128 + t], 2.f * x[r * 128 + (t + 32 * r) % 128]) << "round " << r;
}

// Warp 3 exits; warps 0-2 wait for 128 threads at barrier 1, which only 96 ever reach.
__global__ void __launch_bounds__(128) short_barrier_kernel() {
  if (threadIdx.x >= 96) return;
  named_barrier_sync(1, 128);
}

TEST(EmulatedBarrier, IncompleteSyncIsADeadlock) {
  std::string const error =
      error_of([] { cake::emu::launch(Dim3{1}, Dim3{128}, {}, [] { short_barrier_kernel(); }); });
  EXPECT_NE(error.find("emulator deadlock in block (0, 0)"), std::string::npos) << error;
  EXPECT_NE(error.find("named barrier 1: 96 of 128 threads arrived"), std::string::npos) << error;
}

TEST(EmulatedBarrier, BadIdsAndCountsThrow) {
  auto const run = [](int id, int count) {
    return error_of(
        [&] { cake::emu::launch(Dim3{1}, Dim3{128}, {}, [&] { named_barrier_sync(id, count); }); });
  };
  EXPECT_NE(run(16, 128).find("outside 0 .. 15"), std::string::npos);
  EXPECT_NE(run(1, 100).find("not a positive multiple of 32"), std::string::npos);
  EXPECT_NE(run(1, 160).find("not a positive multiple of 32 up to the block's 128"),
            std::string::npos);
  // Counts that disagree within one phase: warp 0 names 64 threads, the others 128; which count
  // the phase took depends on the warp that arrived first (the schedule).
  std::string const mixed = error_of([] {
    cake::emu::launch(Dim3{1}, Dim3{128}, {},
                      [] { named_barrier_sync(2, threadIdx.x < 32 ? 64 : 128); });
  });
  EXPECT_TRUE(mixed.find("named barrier 2: warp 0 arrives for 64 threads, others for 128") !=
                  std::string::npos ||
              mixed.find("arrives for 128 threads, others for 64") != std::string::npos)
      << mixed;
}

}  // namespace
