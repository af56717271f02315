// GPU check of the GDN and KDA CUDA paths: random problems through the C ABI on the GPU against
// the FP64 reference (the same C ABI on CPU tensors holding the bf16 inputs upcast to float64), a
// table of errors per output, each case rerun in saved and inverse modes
// (options.save_for_backward = 1, 2) and compared bit for bit with recompute mode, and
// forward/backward timings at workload A.
// Exits non-zero on any failure.
//
//   cake_cuda_check            kkt_solve's and the fused backward's checks, all accuracy cases,
//                              then the timings
//   cake_cuda_check --kkt      kkt_solve's check and timing only (kkt_check.cu)
//   cake_cuda_check --walk-bwd the fused backward's stage check and timing only (walk_bwd_check.cu)
//   cake_cuda_check --no-time  accuracy cases only
//   cake_cuda_check --time     timings only
//   cake_cuda_check --workload G   the op timings at workload G (GDN's A, G, M, N, job or KDA's
//                              kda-P4-4, kda-P4-16, kda-P4-64, kda-A; default A)
//   cake_cuda_check --once     one forward and one backward per mode at workload A (for a profiler)
//   cake_cuda_check --once-small  the same on one document of 8192 tokens
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cake/cake.h"
#include "abi_testing.hpp"
#include "core/tensor.hpp"
#include "cuda/device_testing.hpp"
#include "cuda/kkt_check.hpp"
#include "cuda/walk_bwd_check.hpp"

namespace {

#define CUDA_OK(call)                                                                  \
  do {                                                                                 \
    cudaError_t const err_ = (call);                                                   \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,                \
                   cudaGetErrorString(err_));                                          \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

#define CAKE_OK(call)                                                                  \
  do {                                                                                 \
    cakeResult_t const res_ = (call);                                                  \
    if (res_ != cakeSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s: %s\n", __FILE__, __LINE__, #call,            \
                   cakeGetErrorString(res_), cakeGetLastError());                      \
      std::exit(2);                                                                    \
    }                                                                                  \
  } while (0)

uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float from_bf16(uint16_t x) {
  uint32_t bits = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A host array and its device copy, described as cakeTensor_t for both devices.
struct Tensor {
  std::vector<int64_t> shape;
  cakeDtype_t dtype = cakeFloat32;  // of the device copy
  std::vector<double> host;         // exactly the values the device copy holds
  void* dev = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  size_t elem_bytes() const { return dtype == cakeBfloat16 ? 2 : (dtype == cakeInt32 ? 4 : 4); }
  size_t bytes() const { return numel() * elem_bytes(); }

  void alloc() {
    if (dev == nullptr) CUDA_OK(cudaMalloc(&dev, std::max<size_t>(bytes(), 16)));
  }
  void upload() {  // host values -> rounded to dtype on the device; host keeps the rounded values
    alloc();
    if (dtype == cakeBfloat16) {
      std::vector<uint16_t> b(numel());
      for (int64_t i = 0; i < numel(); ++i) {
        b[i] = to_bf16(static_cast<float>(host[i]));
        host[i] = from_bf16(b[i]);
      }
      CUDA_OK(cudaMemcpy(dev, b.data(), bytes(), cudaMemcpyHostToDevice));
    } else if (dtype == cakeInt32) {
      std::vector<int32_t> b(host.begin(), host.end());
      CUDA_OK(cudaMemcpy(dev, b.data(), bytes(), cudaMemcpyHostToDevice));
    } else {
      std::vector<float> b(numel());
      for (int64_t i = 0; i < numel(); ++i) {
        b[i] = static_cast<float>(host[i]);
        host[i] = b[i];
      }
      CUDA_OK(cudaMemcpy(dev, b.data(), bytes(), cudaMemcpyHostToDevice));
    }
  }
  // Device copy = the host pattern repeated (timing runs: no host copy of the full tensor).
  void upload_tiled(int64_t pattern_elems) {
    Tensor pattern = *this;
    pattern.dev = nullptr;
    pattern.shape = {std::min(pattern_elems, numel())};
    pattern.host.assign(host.begin(), host.begin() + pattern.numel());
    pattern.upload();
    alloc();
    size_t const chunk = pattern.bytes();
    for (size_t off = 0; off < bytes(); off += chunk)
      CUDA_OK(cudaMemcpy(static_cast<char*>(dev) + off, pattern.dev, std::min(chunk, bytes() - off),
                         cudaMemcpyDeviceToDevice));
    pattern.release();
    host.clear();
    host.shrink_to_fit();
  }
  void poison() {
    alloc();
    CUDA_OK(cudaMemset(dev, 0xff, bytes()));  // NaN in bf16 and fp32
  }
  std::vector<double> download() const {
    std::vector<double> out(numel());
    if (dtype == cakeBfloat16) {
      std::vector<uint16_t> b(numel());
      CUDA_OK(cudaMemcpy(b.data(), dev, bytes(), cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < numel(); ++i) out[i] = from_bf16(b[i]);
    } else {
      std::vector<float> b(numel());
      CUDA_OK(cudaMemcpy(b.data(), dev, bytes(), cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < numel(); ++i) out[i] = b[i];
    }
    return out;
  }
  void release() {
    if (dev != nullptr) CUDA_OK(cudaFree(dev));
    dev = nullptr;
  }
  cakeTensor_t view(bool on_device, void* host_data = nullptr) const {
    return cake::dense_view(on_device ? dev : host_data,
                            on_device ? dtype : (dtype == cakeInt32 ? cakeInt32 : cakeFloat64),
                            on_device ? cakeCUDA : cakeCPU, shape);
  }
};

cakeTensor_t absent() { return cakeTensor_t{}; }

// kBounded: uniform in (-5, 0) (a 16-token block of KDA's chunk pass may span more than its
// tensor-core reach, so both of its paths run); kZeroAndMinus20: KDA's channels alternately 0
// and -20 in the same token.
enum class GateMode { kRandom, kMinus20, kZero, kBounded, kZeroAndMinus20 };
enum class BetaMode { kRandom, kNearZero, kNearOne };

struct Case {
  std::string name;
  std::vector<int64_t> docs;  // packed documents (cu_seqlens); empty: fixed batch_b x seq_t
  int64_t batch_b = 1;
  int64_t seq_t = 0;
  int64_t H = 2;
  int64_t HV = 6;
  bool with_state = false;  // initial_state, final_state, dht, dh0
  bool l2norm = false;
  GateMode gate = GateMode::kRandom;
  BetaMode beta = BetaMode::kRandom;
  bool beta_bf16 = false;
  bool kda = false;  // KDA: g [B, T, HV, K], a decay per key channel
};

using cake::testing::compare;
using cake::testing::Errors;

std::mt19937_64 rng(20261129);

int64_t g_fill_limit = 0;  // > 0: fill only this many host elements (the timing pattern)

void fill_normal(Tensor& t, double sigma = 1.0) {
  std::normal_distribution<double> normal(0.0, sigma);
  t.host.resize(g_fill_limit > 0 ? std::min(g_fill_limit, t.numel()) : t.numel());
  for (auto& x : t.host) x = normal(rng);
}

// Rows of `dim` scaled to unit norm (the recurrence is stable only for |k| <= ~1).
void normalise_rows(Tensor& t, int64_t dim) {
  for (int64_t r = 0; r < static_cast<int64_t>(t.host.size()) / dim; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += t.host[r * dim + i] * t.host[r * dim + i];
    for (int64_t i = 0; i < dim; ++i) t.host[r * dim + i] /= std::sqrt(ss);
  }
}

struct Problem {
  Case c;
  int64_t B, T, N;
  Tensor q, k, v, g, beta, h0, cu, dout, dht;
  Tensor o, ht, dq, dk, dv, dg, dbeta, dh0;
  cakeOptions_t options{};

  // pattern > 0: inputs are a random pattern of that many elements repeated (for timings).
  explicit Problem(Case const& cs, int64_t pattern = 0) : c(cs) {
    constexpr int64_t K = 128;
    if (c.docs.empty()) {
      B = c.batch_b;
      T = c.seq_t;
      N = B;
    } else {
      B = 1;
      T = 0;
      for (auto n : c.docs) T += n;
      N = static_cast<int64_t>(c.docs.size());
    }
    q = {{B, T, c.H, K}, cakeBfloat16};
    k = {{B, T, c.H, K}, cakeBfloat16};
    v = {{B, T, c.HV, K}, cakeBfloat16};
    std::vector<int64_t> const gate_shape =
        c.kda ? std::vector<int64_t>{B, T, c.HV, K} : std::vector<int64_t>{B, T, c.HV};
    g = {gate_shape, cakeFloat32};
    beta = {{B, T, c.HV}, c.beta_bf16 ? cakeBfloat16 : cakeFloat32};
    h0 = {{N, c.HV, K, K}, cakeFloat32};
    dht = {{N, c.HV, K, K}, cakeFloat32};
    cu = {{N + 1}, cakeInt32};
    dout = {{B, T, c.HV, K}, cakeBfloat16};
    o = {{B, T, c.HV, K}, cakeBfloat16};
    ht = {{N, c.HV, K, K}, cakeFloat32};
    dq = {{B, T, c.H, K}, cakeBfloat16};
    dk = {{B, T, c.H, K}, cakeBfloat16};
    dv = {{B, T, c.HV, K}, cakeBfloat16};
    dg = {gate_shape, cakeFloat32};
    dbeta = {{B, T, c.HV}, beta.dtype};
    dh0 = {{N, c.HV, K, K}, cakeFloat32};

    g_fill_limit = pattern;
    fill_normal(q);
    fill_normal(k);
    if (!c.l2norm) {
      normalise_rows(q, K);
      normalise_rows(k, K);
    }
    fill_normal(v);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    g.host.resize(pattern > 0 ? std::min(pattern, g.numel()) : g.numel());
    for (size_t i = 0; i < g.host.size(); ++i) {
      double& x = g.host[i];
      switch (c.gate) {
        case GateMode::kMinus20: x = -20.0; break;
        case GateMode::kZero: x = 0.0; break;
        case GateMode::kBounded: x = -5.0 * uniform(rng); break;
        case GateMode::kZeroAndMinus20: x = i % 2 == 0 ? 0.0 : -20.0; break;
        case GateMode::kRandom: x = -0.3 * uniform(rng); break;
      }
    }
    beta.host.resize(pattern > 0 ? std::min(pattern, beta.numel()) : beta.numel());
    for (auto& x : beta.host)
      x = c.beta == BetaMode::kNearZero ? 1e-3 * uniform(rng)
          : c.beta == BetaMode::kNearOne ? 1.0 - 1e-3 * uniform(rng)
                                         : 0.05 + 0.9 * uniform(rng);
    fill_normal(h0);
    fill_normal(dht, 0.1);
    fill_normal(dout);
    cu.host = {0};
    for (auto n : c.docs) cu.host.push_back(cu.host.back() + n);
    for (Tensor* t : {&q, &k, &v, &g, &beta, &h0, &dht, &dout}) {
      if (pattern > 0)
        t->upload_tiled(pattern);
      else
        t->upload();
    }
    g_fill_limit = 0;
    for (Tensor* t : {&o, &ht, &dq, &dk, &dv, &dg, &dbeta, &dh0}) t->alloc();
    if (!c.docs.empty()) cu.upload();

    options.struct_size = sizeof(cakeOptions_t);
    options.variant = c.kda ? cakeKda : cakeGdn;
    options.scale = 1.0 / std::sqrt(double(K));
    options.use_qk_l2norm = c.l2norm ? 1 : 0;
  }

  cakeForwardArgs_t forward_args(bool on_device, std::vector<std::vector<double>>& cpu_out) {
    cakeForwardArgs_t a{};
    auto in = [&](Tensor& t) { return t.view(on_device, t.host.data()); };
    a.q = in(q);
    a.k = in(k);
    a.v = in(v);
    a.g = in(g);
    a.beta = in(beta);
    a.initial_state = c.with_state ? in(h0) : absent();
    std::vector<int64_t> cu64(cu.host.begin(), cu.host.end());
    a.cu_seqlens = absent();
    if (!c.docs.empty()) {
      a.cu_seqlens = cu.view(on_device);
      if (!on_device) {
        static thread_local std::vector<int32_t> cu32;
        cu32.assign(cu.host.begin(), cu.host.end());
        a.cu_seqlens.data = cu32.data();
      }
    }
    cpu_out.assign(2, {});
    if (on_device) {
      a.o = o.view(true);
      a.final_state = c.with_state ? ht.view(true) : absent();
    } else {
      cpu_out[0].resize(o.numel());
      cpu_out[1].resize(ht.numel());
      a.o = o.view(false, cpu_out[0].data());
      a.final_state = c.with_state ? ht.view(false, cpu_out[1].data()) : absent();
    }
    return a;
  }

  cakeBackwardArgs_t backward_args(bool on_device, std::vector<std::vector<double>>& cpu_out) {
    std::vector<std::vector<double>> unused;
    cakeForwardArgs_t const f = forward_args(on_device, unused);
    cakeBackwardArgs_t a = cake::testing::backward_inputs(f);
    a.dout = dout.view(on_device, dout.host.data());
    a.dht = c.with_state ? dht.view(on_device, dht.host.data()) : absent();
    Tensor* outs[] = {&dq, &dk, &dv, &dg, &dbeta, &dh0};
    cakeTensor_t* slots[] = {&a.dq, &a.dk, &a.dv, &a.dg, &a.dbeta, &a.dh0};
    cpu_out.assign(6, {});
    for (int i = 0; i < 6; ++i) {
      if (i == 5 && !c.with_state) {
        *slots[i] = absent();
        continue;
      }
      if (on_device) {
        *slots[i] = outs[i]->view(true);
      } else {
        cpu_out[i].resize(outs[i]->numel());
        *slots[i] = outs[i]->view(false, cpu_out[i].data());
      }
    }
    return a;
  }

  void release() {
    for (Tensor* t : {&q, &k, &v, &g, &beta, &h0, &cu, &dout, &dht, &o, &ht, &dq, &dk, &dv, &dg,
                      &dbeta, &dh0})
      t->release();
  }
};

bool run_case(Case const& c) {
  Problem p(c);
  // FP64 reference on the CPU.
  std::vector<std::vector<double>> ref_f, ref_b;
  cakeForwardArgs_t const rf = p.forward_args(false, ref_f);
  CAKE_OK(cakeForward(&p.options, &rf, nullptr, 0, nullptr, 0, nullptr));
  cakeBackwardArgs_t const rb = p.backward_args(false, ref_b);
  CAKE_OK(cakeBackward(&p.options, &rb, nullptr, 0, nullptr, 0, nullptr));

  // GPU in recompute mode, with poisoned outputs and workspace.
  std::vector<std::vector<double>> unused;
  cakeForwardArgs_t const gf = p.forward_args(true, unused);
  cakeBackwardArgs_t const gb = p.backward_args(true, unused);
  size_t fws = 0, bws = 0;
  CAKE_OK(cakeForwardWorkspaceSize(&p.options, &gf, &fws));
  CAKE_OK(cakeBackwardWorkspaceSize(&p.options, &gb, &bws));
  void* ws = nullptr;
  size_t const ws_bytes = std::max(fws, bws);
  CUDA_OK(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 16)));
  for (Tensor* t : {&p.o, &p.ht, &p.dq, &p.dk, &p.dv, &p.dg, &p.dbeta, &p.dh0}) t->poison();
  CUDA_OK(cudaMemset(ws, 0xff, ws_bytes));
  CAKE_OK(cakeForward(&p.options, &gf, nullptr, 0, ws, fws, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemset(ws, 0xff, ws_bytes));
  CAKE_OK(cakeBackward(&p.options, &gb, nullptr, 0, ws, bws, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaFree(ws));

  struct Row {
    char const* name;
    Tensor* got;
    std::vector<double>* ref;
  };
  std::vector<Row> rows = {{"o", &p.o, &ref_f[0]},   {"dq", &p.dq, &ref_b[0]},
                           {"dk", &p.dk, &ref_b[1]}, {"dv", &p.dv, &ref_b[2]},
                           {"dg", &p.dg, &ref_b[3]}, {"dbeta", &p.dbeta, &ref_b[4]}};
  if (c.with_state) {
    rows.insert(rows.begin() + 1, {"ht", &p.ht, &ref_f[1]});
    rows.push_back({"dh0", &p.dh0, &ref_b[5]});
  }
  bool ok = true;
  std::string line;
  for (auto const& r : rows) {
    Errors const e = compare(r.got->download(), *r.ref);
    bool const pass = e.pass();
    ok = ok && pass;
    char buf[96];
    std::snprintf(buf, sizeof buf, " %s %.1e/%.1e%s", r.name, e.rel_rms, e.max_rel,
                  pass ? "" : "!");
    line += buf;
  }
  // Saved and inverse modes on the same inputs give the same bits (the saved set holds exactly
  // what the backward's recompute produces, and the kernels are deterministic); saved set,
  // outputs and workspace poisoned as above.
  std::vector<std::vector<double>> recomputed;
  for (auto const& r : rows) recomputed.push_back(r.got->download());
  for (int32_t mode : {1, 2}) {
    p.options.save_for_backward = mode;
    size_t saved_bytes = 0;
    CAKE_OK(cakeForwardSavedSize(&p.options, &gf, &saved_bytes));
    CAKE_OK(cakeForwardWorkspaceSize(&p.options, &gf, &fws));
    CAKE_OK(cakeBackwardWorkspaceSize(&p.options, &gb, &bws));
    size_t const saved_ws_bytes = std::max(fws, bws);
    void* saved = nullptr;
    CUDA_OK(cudaMalloc(&saved, std::max<size_t>(saved_bytes, 16)));
    CUDA_OK(cudaMalloc(&ws, std::max<size_t>(saved_ws_bytes, 16)));
    CUDA_OK(cudaMemset(saved, 0xff, saved_bytes));
    for (Tensor* t : {&p.o, &p.ht, &p.dq, &p.dk, &p.dv, &p.dg, &p.dbeta, &p.dh0}) t->poison();
    CUDA_OK(cudaMemset(ws, 0xff, saved_ws_bytes));
    CAKE_OK(cakeForward(&p.options, &gf, saved, saved_bytes, ws, fws, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemset(ws, 0xff, saved_ws_bytes));
    CAKE_OK(cakeBackward(&p.options, &gb, saved, saved_bytes, ws, bws, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(ws));
    CUDA_OK(cudaFree(saved));
    bool same = true;
    for (size_t i = 0; i < rows.size(); ++i) {
      std::vector<double> const got = rows[i].got->download();
      for (size_t j = 0; same && j < got.size(); ++j) {
        double const a = got[j], b = recomputed[i][j];
        same = std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
      }
    }
    ok = ok && same;
    char const* const name = mode == 1 ? "saved" : "inverse";
    line += std::string(" ") + name + (same ? "==recompute" : "!=recompute!");
  }
  p.options.save_for_backward = 0;

  std::printf("%-34s %s %s\n", c.name.c_str(), ok ? "PASS" : "FAIL", line.c_str());
  std::fflush(stdout);
  p.release();
  return ok;
}

void time_workload(cake::testing::Workload const& w, bool once, bool small) {
  Case c;
  c.name = std::string("workload ") + w.name;
  c.docs.assign(w.docs.begin(), w.docs.end());
  if (small) c.docs = {8192};
  c.H = w.H;
  c.HV = w.HV;
  c.kda = w.kda;
  c.with_state = false;
  Problem p(c, int64_t{1} << 20);
  std::vector<std::vector<double>> unused;
  cakeForwardArgs_t const gf = p.forward_args(true, unused);
  cakeBackwardArgs_t const gb = p.backward_args(true, unused);
  for (Tensor* t : {&p.o, &p.dq, &p.dk, &p.dv, &p.dg, &p.dbeta}) t->poison();
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  auto time = [&](auto&& body, int reps) {
    body();  // warm-up
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < reps; ++i) {
      CUDA_OK(cudaEventRecord(start));
      body();
      CUDA_OK(cudaEventRecord(stop));
      CUDA_OK(cudaEventSynchronize(stop));
      float t = 0;
      CUDA_OK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  // Recompute mode (save_for_backward = 0), then saved mode: the backward skips the recompute;
  // then recompute and inverse modes with the q/k L2 norm in the op (as the benchmark runs it).
  for (auto [save, l2] :
       {std::pair{0, 0}, std::pair{1, 0}, std::pair{0, 1}, std::pair{2, 1}}) {
    p.options.save_for_backward = save;
    p.options.use_qk_l2norm = l2;
    size_t fws = 0, bws = 0, saved_bytes = 0;
    CAKE_OK(cakeForwardWorkspaceSize(&p.options, &gf, &fws));
    CAKE_OK(cakeBackwardWorkspaceSize(&p.options, &gb, &bws));
    CAKE_OK(cakeForwardSavedSize(&p.options, &gf, &saved_bytes));
    void* ws = nullptr;
    void* saved = nullptr;
    CUDA_OK(cudaMalloc(&ws, std::max(fws, bws)));
    if (saved_bytes > 0) CUDA_OK(cudaMalloc(&saved, saved_bytes));
    auto forward = [&] {
      CAKE_OK(cakeForward(&p.options, &gf, saved, saved_bytes, ws, fws, nullptr));
    };
    auto backward = [&] {
      CAKE_OK(cakeBackward(&p.options, &gb, saved, saved_bytes, ws, bws, nullptr));
    };
    if (once) {
      forward();
      backward();
      CUDA_OK(cudaDeviceSynchronize());
    } else {
      float const f_ms = time(forward, 5);
      float const b_ms = time(backward, 3);
      bool finite = true;
      for (Tensor* t : {&p.dq, &p.dv, &p.dg}) {
        for (double x : t->download())
          if (!std::isfinite(x)) finite = false;
      }
      char const* const mode = save == 2 ? "l2norm inverse"
                               : save == 1 ? "saved"
                               : l2        ? "l2norm recompute"
                                           : "recompute";
      std::string docs;
      for (int32_t const len : c.docs) docs += (docs.empty() ? "" : ",") + std::to_string(len);
      std::printf("workload %s (%s, docs %s; H=%d HV=%d K=V=128), %s mode: "
                  "forward %.3f ms, backward %.3f ms (median), workspace fwd %.2f GB bwd %.2f GB, "
                  "saved %.2f GB, outputs %s\n",
                  w.name, w.kda ? "KDA" : "GDN", docs.c_str(), c.H, c.HV, mode, f_ms, b_ms,
                  fws / 1e9, bws / 1e9,
                  saved_bytes / 1e9, finite ? "finite" : "NOT FINITE");
    }
    CUDA_OK(cudaFree(ws));
    if (saved != nullptr) CUDA_OK(cudaFree(saved));
  }
  p.release();
}

}  // namespace

int main(int argc, char** argv) {
  bool do_check = true, do_time = true, once = false, small = false,
       kkt_only = false, walk_bwd_only = false;
  std::string workload = "A";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--kkt") == 0) kkt_only = true;
    if (std::strcmp(argv[i], "--walk-bwd") == 0) walk_bwd_only = true;
    if (std::strcmp(argv[i], "--no-time") == 0) do_time = false;
    if (std::strcmp(argv[i], "--time") == 0) do_check = false;
    if (std::strcmp(argv[i], "--once") == 0) do_check = false, once = true;
    if (std::strcmp(argv[i], "--once-small") == 0) do_check = false, once = small = true;
    if (std::strcmp(argv[i], "--workload") == 0 && i + 1 < argc) workload = argv[++i];
  }
  auto const timed = std::find_if(cake::testing::kWorkloads.begin(),
                                  cake::testing::kWorkloads.end(),
                                  [&](auto const& w) { return workload == w.name; });
  if (timed == cake::testing::kWorkloads.end()) {
    std::fprintf(stderr, "--workload must be one of device_testing.hpp's kWorkloads, got %s\n",
                 workload.c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  if (walk_bwd_only) {
    bool const walk_ok = !do_check || check_walk_bwd();
    if (do_time) time_walk_bwd();
    return walk_ok ? 0 : 1;
  }
  if (kkt_only) {
    bool const kkt_ok = !do_check || check_kkt_solve();
    if (do_time) time_kkt_solve();
    return kkt_ok ? 0 : 1;
  }
  bool ok = true;
  if (do_check) {
    ok = check_kkt_solve();
    ok = check_walk_bwd() && ok;
    std::vector<Case> cases;
    auto add = [&](Case c) { cases.push_back(c); };
    Case base;
    base.H = 2;
    base.HV = 6;
    {
      Case c = base;
      c.name = "docs 1,63,64,65,1000 GVA 2/6";
      c.docs = {1, 63, 64, 65, 1000};
      add(c);
      c.name = "  + state";
      c.with_state = true;
      add(c);
      c.name = "  + state + l2norm";
      c.l2norm = true;
      add(c);
    }
    {
      Case c = base;
      c.H = c.HV = 4;
      c.name = "docs 1,63,64,65,1000 H=HV=4 st";
      c.docs = {1, 63, 64, 65, 1000};
      c.with_state = true;
      add(c);
      c.name = "  + l2norm, beta bf16";
      c.l2norm = true;
      c.beta_bf16 = true;
      add(c);
    }
    {
      Case c = base;
      c.name = "fixed B=2 T=200 GVA 2/6 st";
      c.batch_b = 2;
      c.seq_t = 200;
      c.with_state = true;
      add(c);
    }
    {
      Case c = base;
      c.docs = {65, 300, 1};
      c.with_state = true;
      c.name = "g=-20 docs 65,300,1 st";
      c.gate = GateMode::kMinus20;
      add(c);
      c.name = "g=0 docs 65,300,1 st";
      c.gate = GateMode::kZero;
      add(c);
      c.name = "beta~0 docs 65,300,1 st";
      c.gate = GateMode::kRandom;
      c.beta = BetaMode::kNearZero;
      add(c);
      c.name = "beta~1 docs 65,300,1 st";
      c.beta = BetaMode::kNearOne;
      add(c);
      c.name = "beta~1 g=0 l2norm st";
      c.gate = GateMode::kZero;
      c.l2norm = true;
      add(c);
    }
    {
      // KDA (a decay per key channel): the chunk pass's tensor-core and pairwise diagonal blocks,
      // the intra pass, every mode bitwise
      Case c = base;
      c.kda = true;
      c.with_state = true;
      c.name = "KDA docs 1,15,16,17,63,64,65,1000 st";
      c.docs = {1, 15, 16, 17, 63, 64, 65, 1000};
      add(c);
      c.name = "  + l2norm, beta bf16";
      c.l2norm = true;
      c.beta_bf16 = true;
      add(c);
      c.l2norm = false;
      c.beta_bf16 = false;
      c.docs = {65, 300, 1};
      c.name = "KDA g bounded (-5,0) docs 65,300,1";
      c.gate = GateMode::kBounded;
      add(c);
      c.name = "KDA g=-20 docs 65,300,1 st";
      c.gate = GateMode::kMinus20;
      add(c);
      c.name = "KDA g 0/-20 by channel docs 65,300,1";
      c.gate = GateMode::kZeroAndMinus20;
      add(c);
      c.name = "KDA beta~1 g=0 l2norm H=HV=4";
      c.H = c.HV = 4;
      c.gate = GateMode::kZero;
      c.beta = BetaMode::kNearOne;
      c.l2norm = true;
      add(c);
    }
    std::printf("%-34s %s  name rel_rms/max_abs_over_max_ref (! = over 1e-2 / 2e-2)\n", "case",
                "result");
    for (auto const& c : cases) ok = run_case(c) && ok;
    std::printf("accuracy: %s\n", ok ? "ALL PASS" : "FAILURES");
  }
  if (do_time) time_workload(*timed, once, small);
  if (do_time && !once) time_kkt_solve();
  return ok ? 0 : 1;
}
