// GPU check of the fused GDN backward (kkt_solve -> h-walk -> walk_a_bwd, in both forms of the
// reverse walk) against the FP64 chunked reference (ref/chunked.hpp) on the same inputs, the
// split form bitwise against the walk, and their times at workload A and the main job's batch.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_testing.hpp"
#include "cuda/walk_bwd_check.hpp"
#include "gdn_testing.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "ref/chunked.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::gdn_testing::Case;
using cake::kernels::kChunk;
using cake::kernels::kHeadDim;
using cake::kernels::Problem;
using cake::testing::compare;
using cake::testing::cu_seqlens_of;
using cake::testing::device_copy;
using cake::testing::Errors;
using cake::testing::host_copy;
using cake::testing::kWorkloadADocs;
using cake::testing::kWorkloadAH;
using cake::testing::kWorkloadAHV;
using cake::testing::kWorkloads;
using cake::testing::make_problem;
using cake::testing::median_ms;

constexpr int K = kHeadDim;

// The device buffers of one run of the three stages.
struct Buffers {
  Problem prob;
  bf16 *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr, *a = nullptr, *h = nullptr,
       *dv = nullptr;
  float *g = nullptr, *beta = nullptr, *gcum = nullptr, *beta_f32 = nullptr, *h0 = nullptr,
        *dht = nullptr, *dq = nullptr, *dk = nullptr, *dbeta = nullptr, *dg = nullptr,
        *dh0 = nullptr, *ds_end = nullptr;
  int32_t* cu = nullptr;
  int* order = nullptr;      // walk_a_bwd's tickets and turns, where the group has several heads
  int* walk_done = nullptr;  // the h-walk's flags, as the op's backward has them
  bool ok = true;

  void alloc(std::vector<int32_t> const& cu_host, int H, int HV) {
    prob = make_problem(cu_host, H, HV);
    cu = device_copy(cu_host);
    prob.cu_seqlens32 = cu;
    int64_t const BT = prob.num_tokens;
    int64_t const states = int64_t{prob.num_seqs} * HV * K * K;
    auto take = [&](auto** x, int64_t count) {
      ok = ok && cudaMalloc(x, std::max<int64_t>(count, 4) * sizeof(**x)) == cudaSuccess;
    };
    take(&q, BT * H * K);
    take(&k, BT * H * K);
    take(&v, BT * HV * K);
    take(&dout, BT * HV * K);
    take(&a, BT * HV * kChunk);
    take(&h, prob.num_slots * HV * K * K);
    take(&ds_end, prob.num_slots * HV * K * K);
    take(&dv, BT * HV * K);
    for (float** x : {&g, &beta, &gcum, &beta_f32, &dbeta, &dg}) take(x, BT * HV);
    for (float** x : {&h0, &dht, &dh0}) take(x, states);
    take(&dq, BT * H * K);
    take(&dk, BT * H * K);
    if (HV > H) take(&order, cake::kernels::walk_a_bwd::walk_order_size(prob));
    take(&walk_done, int64_t{prob.num_seqs} * HV);
    ok = ok && cu != nullptr;
  }
  // NaN in every output, so that elements the kernels do not write fail
  void poison() {
    int64_t const BT = prob.num_tokens;
    int const H = prob.num_qk_heads, HV = prob.num_v_heads;
    cudaMemset(dq, 0xff, BT * H * K * 4);
    cudaMemset(dk, 0xff, BT * H * K * 4);
    cudaMemset(dv, 0xff, BT * HV * K * 2);
    cudaMemset(dbeta, 0xff, BT * HV * 4);
    cudaMemset(dg, 0xff, BT * HV * 4);
    cudaMemset(dh0, 0xff, int64_t{prob.num_seqs} * HV * K * K * 4);
  }
  // kkt_solve -> h-walk -> walk_a_bwd (split: its dS-walk, then its chunk pass), the reverse walk
  // beside the h-walk on its flags, as in the op
  bool run(float scale, bool split, cudaStream_t stream) {
    namespace kn = cake::kernels;
    Problem p = prob;
    p.scale = scale;
    kn::kkt_solve::Params kp;
    kp.problem = p;
    kp.k = k;
    kp.g = g;
    kp.beta = beta;
    kp.gcum = gcum;
    kp.beta_f32 = beta_f32;
    kp.a = a;
    kn::walk_a_fwd::Params fp;
    fp.problem = p;
    fp.q = q;
    fp.k = k;
    fp.v = v;
    fp.a = a;
    fp.gcum = gcum;
    fp.beta = beta_f32;
    fp.h0 = h0;
    fp.h = h;
    fp.walk_done = walk_done;
    kn::walk_a_bwd::Params bp;
    bp.problem = p;
    bp.q = q;
    bp.k = k;
    bp.v = v;
    bp.dout = dout;
    bp.a = a;
    bp.gcum = gcum;
    bp.beta = beta_f32;
    bp.h = h;
    bp.h_ready = walk_done;
    bp.dht = dht;
    bp.dq = dq;
    bp.dk = dk;
    bp.order = order;
    bp.dv = dv;
    bp.dbeta = dbeta;
    bp.dg = dg;
    bp.dh0 = dh0;
    bp.eo_split = h0 != nullptr;
    size_t const flags = sizeof(int) * static_cast<size_t>(p.num_seqs) * p.num_v_heads;
    // the tickets and turns cleared first: neither the h-walk nor the dS-walk touches them, and
    // nothing comes between the h-walk and the reverse walk it runs beside
    bool const cleared =
        order == nullptr ||
        cudaMemsetAsync(order, 0, sizeof(int) * kn::walk_a_bwd::walk_order_size(p), stream) ==
            cudaSuccess;
    if (!(cleared && kn::kkt_solve::launch<kn::ScalarDecay>(kp, stream) == cudaSuccess &&
          cudaMemsetAsync(walk_done, 0, flags, stream) == cudaSuccess &&
          kn::walk_a_fwd::launch<kn::ScalarDecay>(fp, stream) == cudaSuccess))
      return false;
    if (split) {
      if (kn::walk_a_bwd::launch_ds_walk<kn::ScalarDecay>(
              kn::walk_a_bwd::ds_walk_params(bp, ds_end), stream) != cudaSuccess)
        return false;
      bp = kn::walk_a_bwd::chunk_pass_params(bp, ds_end);
    }
    return kn::walk_a_bwd::launch<kn::ScalarDecay>(bp, stream) == cudaSuccess;
  }
  void release() {
    for (void* x : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v),
                    static_cast<void*>(dout), static_cast<void*>(a), static_cast<void*>(h),
                    static_cast<void*>(dv), static_cast<void*>(g), static_cast<void*>(beta),
                    static_cast<void*>(gcum), static_cast<void*>(beta_f32), static_cast<void*>(h0),
                    static_cast<void*>(dht), static_cast<void*>(dq), static_cast<void*>(dk),
                    static_cast<void*>(dbeta), static_cast<void*>(dg), static_cast<void*>(dh0),
                    static_cast<void*>(ds_end), static_cast<void*>(walk_done),
                    static_cast<void*>(cu), static_cast<void*>(order)})
      cudaFree(x);
  }
};

// The gradients of one run, on the host.
struct Grads {
  std::vector<float> dq, dk, dg, dbeta, dh0;
  std::vector<bf16> dv;
};
template <class T>
bool bitwise_equal(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
bool bitwise_equal(Grads const& a, Grads const& b) {
  return bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) && bitwise_equal(a.dg, b.dg) &&
         bitwise_equal(a.dbeta, b.dbeta) && bitwise_equal(a.dh0, b.dh0) &&
         bitwise_equal(a.dv, b.dv);
}

// Both forms of the reverse walk on one drawn problem: each against the FP64 reference, and the
// split's gradients bitwise the walk's.
bool run_case(Case const& wc, std::mt19937& rng) {
  cake::gdn_testing::Problem const pr = cake::gdn_testing::make_problem(wc, rng);
  int64_t const BT = pr.BT;
  int const H = pr.H, HV = pr.HV;

  // FP64 reference on the same (rounded) inputs
  std::vector<double> rq(pr.q.size()), rk(pr.k.size()), rv(pr.v.size()), rg(pr.g.size()),
      rbeta(pr.beta.size()), rh0(pr.states_size());
  cake::ref::Inputs const in{pr.q.data(),    pr.k.data(),  pr.v.data(), pr.g.data(),
                             pr.beta.data(), pr.h0.data(), pr.scale};
  cake::ref::OutputGrads const out{pr.dout.data(), pr.dht.data()};
  cake::ref::InputGrads const grad{rq.data(), rk.data(),    rv.data(),
                                   rg.data(), rbeta.data(), rh0.data()};
  cake::ref::chunked_backward(pr.shape(), in, out, grad);

  Buffers b;
  b.alloc(pr.cu, H, HV);
  bool ok = b.ok;
  if (ok) {
    auto up = [](auto* dev, auto const& host) {
      cudaMemcpy(dev, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice);
    };
    up(b.q, pr.q16);
    up(b.k, pr.k16);
    up(b.v, pr.v16);
    up(b.dout, pr.dout16);
    up(b.g, pr.g32);
    up(b.beta, pr.beta32);
    up(b.h0, pr.h0_32);
    up(b.dht, pr.dht32);
  }
  Grads by_form[2];
  for (bool split : {false, true}) {
    if (ok) {
      b.poison();
      ok = b.run(static_cast<float>(pr.scale), split, nullptr) &&
           cudaDeviceSynchronize() == cudaSuccess;
    }
    Grads& g = by_form[split];
    g = {host_copy(b.dq, BT * H * K),      host_copy(b.dk, BT * H * K), host_copy(b.dg, BT * HV),
         host_copy(b.dbeta, BT * HV),      host_copy(b.dh0, pr.states_size()),
         host_copy(b.dv, BT * HV * K)};
    // the kernel's dq, dk: summed over each q/k head's value heads (fp32, in turn)
    auto widen = [](auto const& x) { return std::vector<double>(x.begin(), x.end()); };
    std::vector<double> dv;
    for (bf16 x : g.dv) dv.push_back(__bfloat162float(x));
    std::vector<std::pair<char const*, Errors>> const errors = {
        {"dq", compare(widen(g.dq), rq)},          {"dk", compare(widen(g.dk), rk)},
        {"dv", compare(dv, rv)},                   {"dg", compare(widen(g.dg), rg)},
        {"dbeta", compare(widen(g.dbeta), rbeta)}, {"dh0", compare(widen(g.dh0), rh0)}};
    std::printf("walk_a_bwd %-5s %-34s", split ? "split" : "walk", wc.name.c_str());
    for (auto const& [name, e] : errors) {
      ok = ok && e.pass();
      std::printf(" %s %.1e/%.1e%s", name, e.rel_rms, e.max_rel, e.pass() ? "" : "!");
    }
    std::printf("  %s\n", ok ? "PASS" : "FAIL");
  }
  bool const same = bitwise_equal(by_form[0], by_form[1]);
  std::printf("walk_a_bwd split == walk bitwise %-22s %s\n", wc.name.c_str(),
              same ? "PASS" : "FAIL");
  b.release();
  return ok && same;
}

}  // namespace

bool check_walk_bwd() {
  unsigned const seed = std::random_device{}();
  std::printf("walk_a_bwd check (kkt_solve -> h-walk -> walk_a_bwd against FP64), seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<Case> cases;
  cases.push_back({"docs 1,63,64,65,300 GVA 2/6", {1, 63, 64, 65, 300}, 2, 6});
  cases.push_back({"docs 65,200 H=HV=4", {65, 200}, 4, 4});
  cases.push_back({"docs 65,200,1 g=-20", {65, 200, 1}, 2, 4, -20.f, -20.f});
  cases.push_back({"docs 65,200,1 g=0", {65, 200, 1}, 2, 4, 0.f, 0.f});
  cases.push_back({"docs 130 beta~0", {130}, 1, 2, -1.f, 0.f, 1e-4f, 2e-4f});
  cases.push_back({"docs 130 beta~1", {130}, 1, 2, -1.f, 0.f, 1.f - 2e-4f, 1.f - 1e-4f});
  Case many{"40 short + 1 long", {}, 2, 4};
  for (int i = 0; i < 40; ++i) many.docs.push_back(1 + 6 * (i % 20));
  many.docs.push_back(700);
  cases.push_back(many);
  bool ok = true;
  for (auto const& c : cases) ok = run_case(c, rng) && ok;
  return ok;
}

// The three stages' median time, with the reverse walk in each form, at workload A and at the
// main job's batch (kWorkloads "job": 48 walks, where the op splits).
void time_walk_bwd() {
  for (auto const& w : kWorkloads) {
    if (std::string(w.name) != "A" && std::string(w.name) != "job") continue;
    int const H = w.H, HV = w.HV;
    Buffers b;
    b.alloc(cu_seqlens_of(w.docs), H, HV);
    int64_t const BT = b.prob.num_tokens;
    bool ok = b.ok;
    if (ok) {  // bytes that read as small bf16 / fp32 values (the timing does not depend on them)
      cudaMemset(b.q, 0x3c, BT * H * K * 2);
      cudaMemset(b.k, 0x3c, BT * H * K * 2);
      cudaMemset(b.v, 0x3c, BT * HV * K * 2);
      cudaMemset(b.dout, 0x3c, BT * HV * K * 2);
      cudaMemset(b.g, 0xbc, BT * HV * 4);
      cudaMemset(b.beta, 0x3e, BT * HV * 4);
      cudaMemset(b.h0, 0, int64_t{b.prob.num_seqs} * HV * K * K * 4);
      cudaMemset(b.dht, 0, int64_t{b.prob.num_seqs} * HV * K * K * 4);
    }
    float const scale = 1.f / std::sqrt(static_cast<float>(K));
    for (bool split : {false, true}) {
      float total = 0;
      if (ok) {
        total = median_ms([&] { ok = b.run(scale, split, nullptr) && ok; }, 7);
        ok = cudaDeviceSynchronize() == cudaSuccess && ok;
      }
      std::printf("workload %s: kkt_solve + h-walk + walk_a_bwd (%s) %.3f ms (median of 7)%s\n",
                  w.name, split ? "split" : "walk", total, ok ? "" : "  CUDA ERROR");
    }
    b.release();
  }
}
