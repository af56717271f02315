// GPU self-test of the wgmma building blocks: blocked tiles loaded by load_tile_blocked_async,
// descriptors of KMajorTile / MNMajorTile, warpgroup_mma and the accumulator layout of
// for_each_wgmma_pair: single products on one warpgroup (every operand major, widths 32, 64, 128,
// a column offset), and the walks' pattern on two warpgroups (M-major A split by rows between the
// warpgroups, two products in one group). Each case draws fresh random bf16 operands, poisons the
// output with NaN, and compares with a double-precision product of the same bf16 values; a layout
// mistake gives errors of order 1, rounding order differences ~1e-6.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/common/wgmma.cuh"
#include "wgmma_check.hpp"

namespace {

using bf16 = __nv_bfloat16;
using namespace cake::kernels;

constexpr int kM = 64;       // rows of A and C: one warpgroup
constexpr int kKd = 128;     // reduction length: 8 wgmma k-steps
constexpr int kBCols = 128;  // B holds 128 columns; a case uses kN of them from kN0

// A is [kM x kKd] K-major (stored [M][K]) or M-major (stored [K][M]); B is [kKd x 128] K-major
// (stored [N][K]) or N-major (stored [K][N]); C = A B[:, kN0 .. kN0 + kN) is [kM x kN] fp32.
template <int kN, int kN0, bool kAKMajor, bool kBKMajor>
__global__ void __launch_bounds__(128)
    wgmma_product_kernel(bf16 const* a, bf16 const* b, float* c) {
  __shared__ __align__(128) bf16 sa[kM * kKd];
  __shared__ __align__(128) bf16 sb[kKd * kBCols];
  if constexpr (kAKMajor)
    load_tile_blocked_async<kM, kKd, 128>(sa, a, kKd, kM);
  else
    load_tile_blocked_async<kKd, kM, 128>(sa, a, kM, kKd);
  if constexpr (kBKMajor)
    load_tile_blocked_async<kBCols, kKd, 128>(sb, b, kKd, kBCols);
  else
    load_tile_blocked_async<kKd, kBCols, 128>(sb, b, kBCols, kKd);
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

constexpr double kTolerance = 1e-3;  // max error / max |ref|

// C [128 x 128] = A1 B1 + A2 B2 with A1, A2 [128 x 64] M-major (stored [K][M], as K^T and Q^T in
// the walks: K [64 x 128] row-major) and B1, B2 [64 x 128] N-major (stored [K][N]); warpgroup g
// computes rows 64 g .. 64 g + 63, both products in one wgmma group.
__global__ void __launch_bounds__(256)
    wgmma_two_group_kernel(bf16 const* a1, bf16 const* b1, bf16 const* a2, bf16 const* b2,
                           float* c) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const tiles = reinterpret_cast<bf16*>(smem_raw);  // a1, b1, a2, b2: [64 x 128] each
  bf16 const* const src[4] = {a1, b1, a2, b2};
  for (int i = 0; i < 4; ++i)
    load_tile_blocked_async<64, 128, 256>(tiles + i * 64 * 128, src[i], 128, 64);
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

template <int kN, int kN0, bool kAKMajor, bool kBKMajor>
bool run_case(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> a(kM * kKd), b(kKd * kBCols);  // logical A[m][k], B[k][n], bf16-exact
  for (auto& x : a) x = __bfloat162float(__float2bfloat16(normal(rng)));
  for (auto& x : b) x = __bfloat162float(__float2bfloat16(normal(rng)));
  std::vector<bf16> a_src(a.size()), b_src(b.size());
  for (int m = 0; m < kM; ++m)
    for (int k = 0; k < kKd; ++k)
      a_src[kAKMajor ? m * kKd + k : k * kM + m] = __float2bfloat16(a[m * kKd + k]);
  for (int k = 0; k < kKd; ++k)
    for (int n = 0; n < kBCols; ++n)
      b_src[kBKMajor ? n * kKd + k : k * kBCols + n] = __float2bfloat16(b[k * kBCols + n]);

  bf16* da = nullptr;
  bf16* db = nullptr;
  float* dc = nullptr;
  bool ok = cudaMalloc(&da, a_src.size() * sizeof(bf16)) == cudaSuccess &&
            cudaMalloc(&db, b_src.size() * sizeof(bf16)) == cudaSuccess &&
            cudaMalloc(&dc, kM * kN * sizeof(float)) == cudaSuccess;
  std::vector<float> c(kM * kN, std::nanf(""));
  if (ok) {
    cudaMemcpy(da, a_src.data(), a_src.size() * sizeof(bf16), cudaMemcpyHostToDevice);
    cudaMemcpy(db, b_src.data(), b_src.size() * sizeof(bf16), cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice);  // poison
    wgmma_product_kernel<kN, kN0, kAKMajor, kBKMajor><<<1, 128>>>(da, db, dc);
    ok = cudaDeviceSynchronize() == cudaSuccess;
    cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost);
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);

  double max_err = 0.0, max_ref = 0.0;
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      double ref = 0.0;
      for (int k = 0; k < kKd; ++k) ref += double{a[m * kKd + k]} * b[k * kBCols + kN0 + n];
      double const got = c[m * kN + n];
      max_err = std::isfinite(got) ? std::fmax(max_err, std::fabs(got - ref)) : INFINITY;
      max_ref = std::fmax(max_ref, std::fabs(ref));
    }
  double const rel = max_err / max_ref;
  ok = ok && rel < kTolerance;
  std::printf(
      "wgmma 64x%dx%d A %s-major, B %s-major, B columns %d..%d  %s  max err / max |ref| %.1e\n", kN,
      kKd, kAKMajor ? "K" : "M", kBKMajor ? "K" : "N", kN0, kN0 + kN - 1, ok ? "PASS" : "FAIL",
      rel);
  return ok;
}

bool run_two_group_case(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  constexpr int kTile = 64 * 128;
  std::vector<float> x(4 * kTile);  // a1, b1, a2, b2 as stored: [64 (K) x 128] each
  for (auto& v : x) v = __bfloat162float(__float2bfloat16(normal(rng)));
  std::vector<bf16> x_src(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_src[i] = __float2bfloat16(x[i]);
  bf16* dx = nullptr;
  float* dc = nullptr;
  int const smem = 4 * kTile * sizeof(bf16);
  bool ok = cudaMalloc(&dx, x_src.size() * sizeof(bf16)) == cudaSuccess &&
            cudaMalloc(&dc, 128 * 128 * sizeof(float)) == cudaSuccess &&
            cudaFuncSetAttribute(wgmma_two_group_kernel,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess;
  std::vector<float> c(128 * 128, std::nanf(""));
  if (ok) {
    cudaMemcpy(dx, x_src.data(), x_src.size() * sizeof(bf16), cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice);  // poison
    wgmma_two_group_kernel<<<1, 256, smem>>>(dx, dx + kTile, dx + 2 * kTile, dx + 3 * kTile, dc);
    ok = cudaDeviceSynchronize() == cudaSuccess;
    cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost);
  }
  cudaFree(dx);
  cudaFree(dc);
  double max_err = 0.0, max_ref = 0.0;
  for (int m = 0; m < 128; ++m)
    for (int n = 0; n < 128; ++n) {
      double ref = 0.0;  // sum_k a1[k][m] b1[k][n] + a2[k][m] b2[k][n]
      for (int k = 0; k < 64; ++k)
        ref += double{x[k * 128 + m]} * x[kTile + k * 128 + n] +
               double{x[2 * kTile + k * 128 + m]} * x[3 * kTile + k * 128 + n];
      double const got = c[m * 128 + n];
      max_err = std::isfinite(got) ? std::fmax(max_err, std::fabs(got - ref)) : INFINITY;
      max_ref = std::fmax(max_ref, std::fabs(ref));
    }
  double const rel = max_err / max_ref;
  ok = ok && rel < kTolerance;
  std::printf(
      "wgmma 2 warpgroups: A1 B1 + A2 B2, A M-major split by rows, one group  %s  "
      "max err / max |ref| %.1e\n",
      ok ? "PASS" : "FAIL", rel);
  return ok;
}

}  // namespace

bool check_wgmma() {
  unsigned const seed = std::random_device{}();
  std::printf("wgmma self-test, seed %u\n", seed);
  std::mt19937 rng(seed);
  bool ok = true;
  ok = run_case<32, 32, true, true>(rng) && ok;
  ok = run_case<64, 0, true, true>(rng) && ok;
  ok = run_case<64, 0, false, false>(rng) && ok;
  ok = run_case<128, 0, true, false>(rng) && ok;
  ok = run_case<128, 0, false, true>(rng) && ok;
  ok = run_case<64, 64, true, false>(rng) && ok;
  ok = run_case<64, 64, false, true>(rng) && ok;
  ok = run_two_group_case(rng) && ok;
  return ok;
}
