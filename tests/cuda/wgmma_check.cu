// GPU self-test of the wgmma building blocks: blocked tiles loaded by load_tile_blocked_async,
// descriptors of KMajorTile / MNMajorTile, warpgroup_mma and the accumulator layout of
// for_each_wgmma_pair, on one warpgroup. Each case draws fresh random bf16 operands, poisons the
// output with NaN, and compares with a double-precision product of the same bf16 values.
#include "wgmma_check.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/common/wgmma.cuh"

namespace {

using bf16 = __nv_bfloat16;
using namespace cake::kernels;

constexpr int kM = 64;      // rows of A and C: one warpgroup
constexpr int kKd = 128;    // reduction length: 8 wgmma k-steps
constexpr int kBCols = 128; // B holds 128 columns; a case uses kN of them from kN0

// A is [kM x kKd] K-major (stored [M][K]) or M-major (stored [K][M]); B is [kKd x 128] K-major
// (stored [N][K]) or N-major (stored [K][N]); C = A B[:, kN0 .. kN0 + kN) is [kM x kN] fp32.
template <int kN, int kN0, bool kAKMajor, bool kBKMajor>
__global__ void __launch_bounds__(128) wgmma_product_kernel(bf16 const* a, bf16 const* b,
                                                            float* c) {
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
  ok = ok && rel < 1e-5;
  std::printf("wgmma 64x%dx%d A %s-major, B %s-major, B columns %d..%d  %s  max err / max |ref| %.1e\n",
              kN, kKd, kAKMajor ? "K" : "M", kBKMajor ? "K" : "N", kN0, kN0 + kN - 1,
              ok ? "PASS" : "FAIL", rel);
  return ok;
}

}  // namespace

bool check_wgmma() {
  std::mt19937 rng(std::random_device{}());
  bool ok = true;
  ok = run_case<64, 0, true, true>(rng) && ok;
  ok = run_case<64, 0, false, false>(rng) && ok;
  ok = run_case<128, 0, true, false>(rng) && ok;
  ok = run_case<128, 0, false, true>(rng) && ok;
  ok = run_case<64, 64, true, false>(rng) && ok;
  ok = run_case<64, 64, false, true>(rng) && ok;
  return ok;
}
