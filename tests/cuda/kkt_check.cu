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

#include "cuda/kkt_check.hpp"
#include "kernels/intra_fwd/launch.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/state_output_fwd/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"

namespace {

using cake::kernels::kChunk;
using cake::kernels::kHeadDim;
using cake::kernels::Problem;

constexpr int K = kHeadDim;

template <class T>
T* device_copy(std::vector<T> const& host) {
  T* dev = nullptr;
  if (cudaMalloc(&dev, std::max<size_t>(host.size() * sizeof(T), 16)) != cudaSuccess)
    return nullptr;
  cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return dev;
}

template <class T>
std::vector<T> host_copy(T const* dev, size_t n) {
  std::vector<T> host(n);
  cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

Problem make_problem(std::vector<int32_t> const& cu, int H, int HV) {
  Problem p;
  p.num_seqs = static_cast<int32_t>(cu.size()) - 1;
  p.num_tokens = cu.back();
  p.num_qk_heads = H;
  p.num_v_heads = HV;
  p.num_slots = p.num_tokens / kChunk + p.num_seqs + 1;
  return p;
}

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
  std::vector<int32_t> cu{0};
  for (int len : kc.docs) cu.push_back(cu.back() + len);
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
                         cudaMalloc(&p.a, BT * HV * kChunk * sizeof(__nv_bfloat16)) == cudaSuccess;
  cudaMemset(p.gcum, 0xff, BT * HV * sizeof(float));  // NaN: unwritten elements fail
  cudaMemset(p.a, 0xff, BT * HV * kChunk * sizeof(__nv_bfloat16));
  bool ok = allocated && cake::kernels::kkt_solve::launch(p, nullptr) == cudaSuccess &&
            cudaDeviceSynchronize() == cudaSuccess;
  std::vector<__nv_bfloat16> a = host_copy(p.a, BT * HV * kChunk);
  std::vector<float> gcum = host_copy(p.gcum, BT * HV);

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
  ok = ok && finite && rel_rms <= 4e-3 && max_rel <= 8e-3 && g_err <= 1e-5;
  std::printf("kkt_solve %-32s %s  A %.1e/%.1e  G %.1e%s\n", kc.name.c_str(), ok ? "PASS" : "FAIL",
              rel_rms, max_rel, g_err, finite ? "" : "  (non-finite outputs)");
  cudaFree(cu_dev);
  cudaFree(const_cast<__nv_bfloat16*>(p.k));
  cudaFree(const_cast<float*>(p.g));
  cudaFree(const_cast<void*>(p.beta));
  cudaFree(p.gcum);
  cudaFree(p.a);
  return ok;
}

template <class Launch>
float median_ms(Launch const& launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < 15; ++i) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The forward both ways on one pack: intra_fwd -> state_output_fwd (today's, checked against
// the FP64 reference by the GDN check) and kkt_solve -> walk_a_fwd; o and the final state.
struct ForwardBuffers {
  Problem prob;
  int64_t BT = 0;
  __nv_bfloat16 *q = nullptr, *k = nullptr, *v = nullptr, *w = nullptr, *u = nullptr, *a = nullptr;
  __nv_bfloat16 *o_old = nullptr, *o_new = nullptr;
  float *g = nullptr, *beta = nullptr, *gcum = nullptr, *h0 = nullptr, *ht_old = nullptr,
        *ht_new = nullptr;
  int32_t* cu = nullptr;

  bool allocated = true;  // every cudaMalloc succeeded

  ForwardBuffers(ForwardBuffers const&) = delete;
  ForwardBuffers& operator=(ForwardBuffers const&) = delete;
  ForwardBuffers(std::vector<int32_t> const& cu_host, int H, int HV) {
    prob = make_problem(cu_host, H, HV);
    BT = cu_host.back();
    cu = device_copy(cu_host);
    prob.cu_seqlens32 = cu;
    int64_t const N = prob.num_seqs;
    auto const take = [&](cudaError_t err) { allocated = allocated && err == cudaSuccess; };
    take(cudaMalloc(&q, BT * H * K * 2));
    take(cudaMalloc(&k, BT * H * K * 2));
    for (auto** x : {&v, &w, &u, &o_old, &o_new}) take(cudaMalloc(x, BT * HV * K * 2));
    take(cudaMalloc(&a, BT * HV * kChunk * 2));
    for (auto** x : {&g, &beta, &gcum}) take(cudaMalloc(x, BT * HV * 4));
    for (auto** x : {&h0, &ht_old, &ht_new}) take(cudaMalloc(x, N * HV * K * K * 4));
    allocated = allocated && cu != nullptr;
  }
  ~ForwardBuffers() {
    for (void* x : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                    static_cast<void*>(w), static_cast<void*>(u), static_cast<void*>(a),
                    static_cast<void*>(o_old), static_cast<void*>(o_new), static_cast<void*>(g),
                    static_cast<void*>(beta), static_cast<void*>(gcum), static_cast<void*>(h0),
                    static_cast<void*>(ht_old), static_cast<void*>(ht_new), static_cast<void*>(cu)})
      cudaFree(x);
  }
  bool run_old() {
    cake::kernels::intra_fwd::Params ip;
    ip.problem = prob;
    ip.k = k;
    ip.v = v;
    ip.g = g;
    ip.beta = beta;
    ip.gcum = gcum;
    ip.w = w;
    ip.u = u;
    cake::kernels::state_output_fwd::Params sp;
    sp.problem = prob;
    sp.q = q;
    sp.k = k;
    sp.w = w;
    sp.u = u;
    sp.gcum = gcum;
    sp.h0 = h0;
    sp.o = o_old;
    sp.ht = ht_old;
    return cake::kernels::intra_fwd::launch(ip, nullptr) == cudaSuccess &&
           cake::kernels::state_output_fwd::launch(sp, nullptr) == cudaSuccess;
  }
  bool run_new() {
    cake::kernels::kkt_solve::Params kp;
    kp.problem = prob;
    kp.k = k;
    kp.g = g;
    kp.beta = beta;
    kp.gcum = gcum;
    kp.a = a;
    cake::kernels::walk_a_fwd::Params wp;
    wp.problem = prob;
    wp.q = q;
    wp.k = k;
    wp.v = v;
    wp.a = a;
    wp.gcum = gcum;
    wp.beta = beta;
    wp.h0 = h0;
    wp.o = o_new;
    wp.ht = ht_new;
    return cake::kernels::kkt_solve::launch(kp, nullptr) == cudaSuccess &&
           cake::kernels::walk_a_fwd::launch(wp, nullptr) == cudaSuccess;
  }
};

// Relative RMS and max error / max |ref| of got against ref; false when got has a non-finite.
bool compare(std::vector<double> const& got, std::vector<double> const& ref, double& rel_rms,
             double& max_rel) {
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  bool finite = true;
  for (size_t i = 0; i < got.size(); ++i) {
    finite = finite && std::isfinite(got[i]);
    err2 += (got[i] - ref[i]) * (got[i] - ref[i]);
    ref2 += ref[i] * ref[i];
    max_err = std::max(max_err, std::abs(got[i] - ref[i]));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  rel_rms = std::sqrt(err2 / std::max(ref2, 1e-300));
  max_rel = max_err / std::max(max_ref, 1e-300);
  return finite;
}

std::vector<double> bf16_to_double(__nv_bfloat16 const* dev, size_t n) {
  std::vector<__nv_bfloat16> h = host_copy(dev, n);
  return std::vector<double>(h.begin(), h.end());
}
std::vector<double> f32_to_double(float const* dev, size_t n) {
  std::vector<float> h = host_copy(dev, n);
  return std::vector<double>(h.begin(), h.end());
}

// The forward in double precision, token by token (the recurrence, not the chunked form):
//   S = e^{g_t} S;  S += beta_t k_t (v_t - S^T k_t)^T;  o_t = scale S^T q_t
// per document and value head, S [K x V] from h0; o [BT, HV, V], ht [N, HV, K, V].
void reference_forward(std::vector<int32_t> const& cu, int H, int HV, double scale,
                       std::vector<double> const& q, std::vector<double> const& k,
                       std::vector<double> const& v, std::vector<float> const& g,
                       std::vector<float> const& beta, std::vector<float> const& h0,
                       std::vector<double>& o, std::vector<double>& ht) {
  int64_t const N = static_cast<int64_t>(cu.size()) - 1;
  o.assign(static_cast<size_t>(cu.back()) * HV * K, 0.0);
  ht.assign(static_cast<size_t>(N) * HV * K * K, 0.0);
  std::vector<double> S(K * K), pred(K);
  for (int64_t n = 0; n < N; ++n)
    for (int hv = 0; hv < HV; ++hv) {
      int const h = hv / (HV / H);
      for (int i = 0; i < K * K; ++i) S[i] = h0[(n * HV + hv) * K * K + i];
      for (int64_t t = cu[n]; t < cu[n + 1]; ++t) {
        double const alpha = std::exp(double{g[t * HV + hv]});
        double const b = beta[t * HV + hv];
        double const* const kt = &k[(t * H + h) * K];
        double const* const qt = &q[(t * H + h) * K];
        double const* const vt = &v[(t * HV + hv) * K];
        for (auto& x : S) x *= alpha;
        std::fill(pred.begin(), pred.end(), 0.0);
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < K; ++c) pred[c] += S[r * K + c] * kt[r];
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < K; ++c) S[r * K + c] += b * kt[r] * (vt[c] - pred[c]);
        double* const ot = &o[(t * HV + hv) * K];
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < K; ++c) ot[c] += scale * S[r * K + c] * qt[r];
      }
      for (int i = 0; i < K * K; ++i) ht[(n * HV + hv) * K * K + i] = S[i];
    }
}

bool run_walk_case(std::string const& name, std::vector<int> const& docs, float g_scale,
                   std::mt19937& rng) {
  std::vector<int32_t> cu{0};
  for (int len : docs) cu.push_back(cu.back() + len);
  int const H = 2;
  int const HV = 6;
  ForwardBuffers b(cu, H, HV);
  int64_t const BT = b.BT;
  int64_t const N = b.prob.num_seqs;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  auto unit_rows = [&](int64_t rows) {  // bf16 rows of unit length (q, k after L2 norm)
    std::vector<__nv_bfloat16> x(rows * K);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> row(K);
      double norm = 0;
      for (auto& e : row) e = normal(rng), norm += double{e} * e;
      for (int c = 0; c < K; ++c)
        x[r * K + c] = __float2bfloat16(static_cast<float>(row[c] / std::sqrt(norm)));
    }
    return x;
  };
  std::vector<__nv_bfloat16> q = unit_rows(BT * H), k = unit_rows(BT * H), v(BT * HV * K);
  for (auto& x : v) x = __float2bfloat16(normal(rng));
  std::vector<float> g(BT * HV), beta(BT * HV), h0(N * HV * K * K);
  for (auto& x : g) x = g_scale * unit(rng);
  for (auto& x : beta) x = unit(rng);
  for (auto& x : h0) x = 0.1f * normal(rng);
  cudaMemcpy(b.q, q.data(), q.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(b.k, k.data(), k.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(b.v, v.data(), v.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(b.g, g.data(), g.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(b.beta, beta.data(), beta.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(b.h0, h0.data(), h0.size() * 4, cudaMemcpyHostToDevice);
  b.prob.scale = 1.f / std::sqrt(static_cast<float>(K));
  for (void* x : {static_cast<void*>(b.o_old), static_cast<void*>(b.o_new)})
    cudaMemset(x, 0xff, BT * HV * K * 2);  // NaN: unwritten elements fail
  for (void* x : {static_cast<void*>(b.ht_old), static_cast<void*>(b.ht_new)})
    cudaMemset(x, 0xff, N * HV * K * K * 4);
  bool ok = b.allocated && b.run_old() && b.run_new() && cudaDeviceSynchronize() == cudaSuccess;
  std::vector<double> o_ref, ht_ref;
  reference_forward(cu, H, HV, b.prob.scale, std::vector<double>(q.begin(), q.end()),
                    std::vector<double>(k.begin(), k.end()),
                    std::vector<double>(v.begin(), v.end()), g, beta, h0, o_ref, ht_ref);
  // Errors against the FP64 reference: [0] o, [1] ht; rel. RMS and max / max|ref|.
  double rms_new[2], max_new[2], rms_old[2], max_old[2];
  ok = ok && compare(bf16_to_double(b.o_new, BT * HV * K), o_ref, rms_new[0], max_new[0]);
  ok = ok && compare(f32_to_double(b.ht_new, N * HV * K * K), ht_ref, rms_new[1], max_new[1]);
  ok = ok && compare(bf16_to_double(b.o_old, BT * HV * K), o_ref, rms_old[0], max_old[0]);
  ok = ok && compare(f32_to_double(b.ht_old, N * HV * K * K), ht_ref, rms_old[1], max_old[1]);
  // The accuracy gate, and no more than 1.5x today's forward's error (plus bf16's floor).
  for (int x = 0; ok && x < 2; ++x)
    ok = rms_new[x] <= 1e-2 && max_new[x] <= 2e-2 && rms_new[x] <= 1.5 * rms_old[x] + 1e-3;
  std::printf(
      "walk_a_fwd %-31s %s  o %.1e/%.1e (today %.1e/%.1e)  ht %.1e/%.1e (today "
      "%.1e/%.1e)\n",
      name.c_str(), ok ? "PASS" : "FAIL", rms_new[0], max_new[0], rms_old[0], max_old[0],
      rms_new[1], max_new[1], rms_old[1], max_old[1]);
  return ok;
}

}  // namespace

bool check_kkt_solve() {
  unsigned const seed = std::random_device{}();
  std::printf("kkt_solve and walk_a_fwd checks, seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<KktCase> cases;
  cases.push_back({"docs 1,63,64,65,1000 GVA 2/6", {1, 63, 64, 65, 1000}});
  cases.push_back({"docs 65,300,1 beta~0", {65, 300, 1}, 2, 6, Beta::kNearZero});
  cases.push_back({"docs 65,300,1 beta~1", {65, 300, 1}, 2, 6, Beta::kNearOne});
  cases.push_back({"docs 65,300,1 H=HV=4 beta bf16", {65, 300, 1}, 4, 4, Beta::kUniform, true});
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
  ok = run_walk_case("docs 1,63,64,65,1000 GVA 2/6", {1, 63, 64, 65, 1000}, -0.5f, rng) && ok;
  ok = run_walk_case("docs 65,300,1 g in (-20, 0)", {65, 300, 1}, -20.f, rng) && ok;
  ok = run_walk_case("docs 65,300,1 g=0", {65, 300, 1}, 0.f, rng) && ok;
  return ok;
}

void time_kkt_solve() {
  std::vector<int32_t> cu{0, 98304, 98304 + 65536, 98304 + 65536 + 57344, 262144};
  ForwardBuffers b(cu, 16, 48);
  int64_t const BT = b.BT;
  int const H = 16;
  int const HV = 48;
  // Inputs: bytes that read as small bf16 / fp32 values (the timing does not depend on them).
  cudaMemset(b.q, 0x3c, BT * H * K * 2);  // bf16 0x3c3c ~ 0.0115
  cudaMemset(b.k, 0x3c, BT * H * K * 2);
  cudaMemset(b.v, 0x3c, BT * HV * K * 2);
  cudaMemset(b.g, 0xbc, BT * HV * 4);     // fp32 0xbcbcbcbc ~ -0.023
  cudaMemset(b.beta, 0x3e, BT * HV * 4);  // fp32 0x3e3e3e3e ~ 0.186
  cudaMemset(b.h0, 0, b.prob.num_seqs * HV * K * K * 4);
  b.prob.scale = 1.f / std::sqrt(static_cast<float>(K));
  bool ok = b.allocated;
  float const old_ms = median_ms([&] { ok = b.run_old() && ok; });
  float const new_ms = median_ms([&] { ok = b.run_new() && ok; });
  cake::kernels::kkt_solve::Params kp;
  kp.problem = b.prob;
  kp.k = b.k;
  kp.g = b.g;
  kp.beta = b.beta;
  kp.gcum = b.gcum;
  kp.a = b.a;
  float const kkt_ms =
      median_ms([&] { ok = cake::kernels::kkt_solve::launch(kp, nullptr) == cudaSuccess && ok; });
  ok = cudaDeviceSynchronize() == cudaSuccess && ok;
  std::printf(
      "workload A forward (median of 15, inputs warm): intra_fwd + state_output_fwd %.3f "
      "ms; kkt_solve + walk_a_fwd %.3f ms (kkt_solve alone %.3f ms)%s\n",
      old_ms, new_ms, kkt_ms, ok ? "" : "  CUDA ERROR");
}
