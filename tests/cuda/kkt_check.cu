// GPU check of kkt_solve: A = (I + diag(beta) strict-lower(K K^T))^-1 per (chunk, value head)
// and G = the chunk-local cumsum of g, against double precision on the same bf16 keys and beta.
// Outputs are poisoned (NaN) before each run, so rows the kernel does not write fail.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_testing.hpp"
#include "cuda/kkt_check.hpp"
#include "kernels/kkt_solve/launch.hpp"

namespace {

using cake::kernels::kChunk;
using cake::kernels::kHeadDim;
using cake::kernels::Problem;
using cake::testing::cu_seqlens_of;
using cake::testing::device_copy;
using cake::testing::host_copy;
using cake::testing::kWorkloadADocs;
using cake::testing::kWorkloadAH;
using cake::testing::kWorkloadAHV;
using cake::testing::make_problem;
using cake::testing::median_ms;

constexpr int K = kHeadDim;

enum class Beta { kUniform, kNearZero, kNearOne };

struct KktCase {
  std::string name;
  std::vector<int> docs;
  int H = 2;
  int HV = 6;
  Beta beta = Beta::kUniform;
  bool beta_bf16 = false;
  // Keys share a direction (k = normalize(0.5 noise + d_h)), so that K K^T is far from diagonal
  // and the inverse far from I - L: random unit keys in 128 dimensions are nearly orthogonal,
  // which would leave an error in the solve's merges almost invisible.
  bool correlated = false;
};

bool run_kkt_case(KktCase const& kc, std::mt19937& rng) {
  std::vector<int32_t> const cu = cu_seqlens_of(kc.docs);
  int64_t const BT = cu.back();
  int const H = kc.H;
  int const HV = kc.HV;

  // Keys: normal rows (plus the head's direction when correlated) scaled to unit length (as
  // after q/k L2 norm), then rounded to bf16.
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> direction(H * K);
  for (auto& x : direction) x = normal(rng) / std::sqrt(static_cast<float>(K));
  std::vector<__nv_bfloat16> k(BT * H * K);
  std::vector<double> kd(k.size());
  for (int64_t r = 0; r < BT * H; ++r) {
    std::vector<float> row(K);
    double norm = 0;
    for (int c = 0; c < K; ++c) {
      float const noise = normal(rng);
      row[c] = kc.correlated
                   ? 0.5f * noise / std::sqrt(static_cast<float>(K)) + direction[r % H * K + c]
                   : noise;
      norm += double{row[c]} * row[c];
    }
    for (int c = 0; c < K; ++c) {
      k[r * K + c] = __float2bfloat16(static_cast<float>(row[c] / std::sqrt(norm)));
      kd[r * K + c] = __bfloat162float(k[r * K + c]);
    }
  }
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<float> g(BT * HV), beta(BT * HV);
  std::vector<__nv_bfloat16> beta16(BT * HV);
  for (auto& x : g) x = -0.5f * unit(rng);
  for (int64_t i = 0; i < BT * HV; ++i) {
    float b = unit(rng);
    if (kc.beta == Beta::kNearZero) b *= 1e-3f;
    if (kc.beta == Beta::kNearOne) b = 1.f - 1e-3f * b;
    beta16[i] = __float2bfloat16(b);
    beta[i] = kc.beta_bf16 ? __bfloat162float(beta16[i]) : b;
  }

  Problem prob = make_problem(cu, H, HV);
  int32_t* cu_dev = device_copy(cu);
  cake::kernels::kkt_solve::Params p;
  p.problem = prob;
  p.problem.cu_seqlens32 = cu_dev;
  p.k = device_copy(k);
  p.g = device_copy(g);
  p.beta = kc.beta_bf16 ? static_cast<void const*>(device_copy(beta16))
                        : static_cast<void const*>(device_copy(beta));
  p.beta_is_bf16 = kc.beta_bf16;
  bool const allocated = cudaMalloc(&p.gcum, BT * HV * sizeof(float)) == cudaSuccess &&
                         cudaMalloc(&p.beta_f32, BT * HV * sizeof(float)) == cudaSuccess &&
                         cudaMalloc(&p.a, BT * HV * kChunk * sizeof(__nv_bfloat16)) == cudaSuccess;
  cudaMemset(p.gcum, 0xff, BT * HV * sizeof(float));  // NaN: unwritten elements fail
  cudaMemset(p.beta_f32, 0xff, BT * HV * sizeof(float));
  cudaMemset(p.a, 0xff, BT * HV * kChunk * sizeof(__nv_bfloat16));
  bool ok =
      allocated &&
      cake::kernels::kkt_solve::launch<cake::kernels::ScalarDecay>(p, nullptr) == cudaSuccess &&
      cudaDeviceSynchronize() == cudaSuccess;
  std::vector<__nv_bfloat16> a = host_copy(p.a, BT * HV * kChunk);
  std::vector<float> gcum = host_copy(p.gcum, BT * HV);
  // beta in fp32: the input's value exactly (bf16 widens exactly), for every token and head
  std::vector<float> beta_f32 = host_copy(p.beta_f32, BT * HV);
  bool const beta_exact = std::equal(beta.begin(), beta.end(), beta_f32.begin());

  // Reference: per (document, chunk, value head), forward substitution in double.
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0, g_err = 0;
  bool finite = true;
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    for (int64_t t0 = cu[n]; t0 < cu[n + 1]; t0 += kChunk) {
      int const len = static_cast<int>(std::min<int64_t>(kChunk, cu[n + 1] - t0));
      for (int hv = 0; hv < HV; ++hv) {
        int const h = hv / (HV / H);
        std::vector<double> l(len * len, 0.0), inv(len * len, 0.0);
        for (int i = 0; i < len; ++i)
          for (int j = 0; j < i; ++j) {
            double dot = 0;
            for (int c = 0; c < K; ++c)
              dot += kd[((t0 + i) * H + h) * K + c] * kd[((t0 + j) * H + h) * K + c];
            l[i * len + j] = beta[(t0 + i) * HV + hv] * dot;
          }
        for (int j = 0; j < len; ++j)  // column j of (I + L)^-1
          for (int i = 0; i < len; ++i) {
            double x = i == j ? 1.0 : 0.0;
            for (int m = 0; m < i; ++m) x -= l[i * len + m] * inv[m * len + j];
            inv[i * len + j] = x;
          }
        double gsum = 0;
        for (int i = 0; i < len; ++i) {
          gsum += g[(t0 + i) * HV + hv];
          double const gg = gcum[(t0 + i) * HV + hv];
          finite = finite && std::isfinite(gg);
          g_err = std::max(g_err, std::abs(gg - gsum) / std::max(1.0, std::abs(gsum)));
          for (int j = 0; j < kChunk; ++j) {
            double const ref = j < len ? inv[i * len + j] : 0.0;  // j >= len > i: upper
            double const got = __bfloat162float(a[((t0 + i) * HV + hv) * kChunk + j]);
            finite = finite && std::isfinite(got);
            err2 += (got - ref) * (got - ref);
            ref2 += ref * ref;
            max_err = std::max(max_err, std::abs(got - ref));
            max_ref = std::max(max_ref, std::abs(ref));
          }
        }
      }
    }
  }
  double const rel_rms = std::sqrt(err2 / std::max(ref2, 1e-300));
  double const max_rel = max_err / std::max(max_ref, 1e-300);
  // A is rounded once to bf16 (relative error <= 2^-9 per element): the gate is 2x that.
  ok = ok && finite && rel_rms <= 4e-3 && max_rel <= 8e-3 && g_err <= 1e-5 && beta_exact;
  std::printf("kkt_solve %-32s %s  A %.1e/%.1e  G %.1e%s%s\n", kc.name.c_str(),
              ok ? "PASS" : "FAIL", rel_rms, max_rel, g_err, finite ? "" : "  (non-finite outputs)",
              beta_exact ? "" : "  (beta_f32 differs from beta)");
  cudaFree(cu_dev);
  cudaFree(const_cast<__nv_bfloat16*>(p.k));
  cudaFree(const_cast<float*>(p.g));
  cudaFree(const_cast<void*>(p.beta));
  cudaFree(p.gcum);
  cudaFree(p.beta_f32);
  cudaFree(p.a);
  return ok;
}

}  // namespace

bool check_kkt_solve() {
  unsigned const seed = std::random_device{}();
  std::printf("kkt_solve check, seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<KktCase> cases;
  cases.push_back({"docs 1,63,64,65,1000 GVA 2/6", {1, 63, 64, 65, 1000}});
  cases.push_back({"docs 65,300,1 beta~0", {65, 300, 1}, 2, 6, Beta::kNearZero});
  cases.push_back({"docs 65,300,1 beta~1", {65, 300, 1}, 2, 6, Beta::kNearOne});
  cases.push_back({"docs 65,300,1 H=HV=4 beta bf16", {65, 300, 1}, 4, 4, Beta::kUniform, true});
  cases.push_back({"docs 1,64,129 H=1 HV=8", {1, 64, 129}, 1, 8});
  KktCase corr{"docs 65,300,1 correlated keys beta~1", {65, 300, 1}, 2, 6, Beta::kNearOne};
  corr.correlated = true;
  cases.push_back(corr);
  corr.name = "docs 1,63,64,65,1000 correlated keys";
  corr.docs = {1, 63, 64, 65, 1000};
  corr.beta = Beta::kUniform;
  cases.push_back(corr);
  KktCase many{"40 short + 1 long (binary search)", {}};
  for (int i = 0; i < 40; ++i) many.docs.push_back(1 + 6 * (i % 20));
  many.docs.push_back(3000);
  cases.push_back(many);
  bool ok = true;
  for (auto const& c : cases) ok = run_kkt_case(c, rng) && ok;
  return ok;
}

void time_kkt_solve() {
  std::vector<int32_t> const cu = cu_seqlens_of(kWorkloadADocs);
  int const H = kWorkloadAH;
  int const HV = kWorkloadAHV;
  int64_t const BT = cu.back();
  Problem prob = make_problem(cu, H, HV);
  int32_t* cu_dev = device_copy(cu);
  prob.cu_seqlens32 = cu_dev;
  // Inputs: bytes that read as small bf16 / fp32 values (the timing does not depend on them).
  __nv_bfloat16 *k = nullptr, *a = nullptr;
  float *g = nullptr, *beta = nullptr, *gcum = nullptr, *beta_f32 = nullptr;
  bool ok = cu_dev != nullptr;
  auto const take = [&](cudaError_t err) { ok = ok && err == cudaSuccess; };
  take(cudaMalloc(&k, BT * H * K * 2));
  take(cudaMalloc(&a, BT * HV * kChunk * 2));
  for (auto** x : {&g, &beta, &gcum, &beta_f32}) take(cudaMalloc(x, BT * HV * 4));
  if (ok) {
    cudaMemset(k, 0x3c, BT * H * K * 2);  // bf16 0x3c3c ~ 0.0115
    cudaMemset(g, 0xbc, BT * HV * 4);     // fp32 0xbcbcbcbc ~ -0.023
    cudaMemset(beta, 0x3e, BT * HV * 4);  // fp32 0x3e3e3e3e ~ 0.186
  }
  cake::kernels::kkt_solve::Params kp;
  kp.problem = prob;
  kp.k = k;
  kp.g = g;
  kp.beta = beta;
  kp.gcum = gcum;
  kp.beta_f32 = beta_f32;
  kp.a = a;
  float kkt_ms = 0;
  if (ok) {
    kkt_ms = median_ms(
        [&] {
          ok = cake::kernels::kkt_solve::launch<cake::kernels::ScalarDecay>(kp, nullptr) ==
                   cudaSuccess &&
               ok;
        },
        15);
    ok = cudaDeviceSynchronize() == cudaSuccess && ok;
  }
  std::printf("workload A: kkt_solve %.3f ms (median of 15, inputs warm)%s\n", kkt_ms,
              ok ? "" : "  CUDA ERROR");
  for (void* x : {static_cast<void*>(cu_dev), static_cast<void*>(k), static_cast<void*>(a),
                  static_cast<void*>(g), static_cast<void*>(beta), static_cast<void*>(gcum),
                  static_cast<void*>(beta_f32)})
    cudaFree(x);
}
