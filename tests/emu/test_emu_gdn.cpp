// The GDN CUDA kernels' own source, run on the CPU emulator (emu/runtime.hpp), against the FP64
// chunked reference: the forward (kkt_solve -> walk_a_fwd) and the backward's stages (kkt_solve
// -> h-walk -> walk_a_bwd) on small packed problems with the edge cases of the GPU check (document
// lengths 1, 63, 64, 65, grouped value heads, states, g = -20 and 0, beta near 0 and 1). Outputs
// and shared memory are poisoned (NaN) before each run.
// The launches run on the emulator (launch_emu.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "emu/gdn_emu_testing.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::Errors;
using cake::emu_testing::K;
using cake::emu_testing::poisoned;
using cake::emu_testing::Pool;
using cake::emu_testing::widen;
using cake::gdn_testing::Case;
using cake::gdn_testing::Problem;
namespace kn = cake::kernels;

// G, A and beta in fp32 of a problem (kkt_solve).
struct Solved {
  std::vector<float> gcum, beta;
  std::vector<bf16> a;
};

Solved run_kkt_solve(Problem const& pr) {
  Solved out{poisoned<float>(pr.BT * pr.HV), poisoned<float>(pr.BT * pr.HV),
             poisoned<bf16>(pr.BT * pr.HV * kn::kChunk)};
  kn::kkt_solve::Params p;
  p.problem = pr.kernel_problem();
  p.k = pr.k16.data();
  p.g = pr.g32.data();
  p.beta = pr.beta32.data();
  p.gcum = out.gcum.data();
  p.beta_f32 = out.beta.data();
  p.a = out.a.data();
  EXPECT_EQ(kn::kkt_solve::launch<kn::ScalarDecay>(p, nullptr), cudaSuccess);
  return out;
}

// Draws per case: pooled, three draws hold dg's relative error (whose single-draw tail reaches
// 1.1e-2 on these sizes, with kernels that pass the GPU check too) well inside the gate.
constexpr int kDraws = 3;

void expect_pass(char const* what, Case const& c, Pool const& pool) {
  cake::emu_testing::expect_pass(std::string(what) + " " + c.name, pool);
}

// The forward walk's inputs for a case (kkt_solve's A, G, beta; h0 when the case has states); the
// caller sets its outputs (o, ht, h).
kn::walk_a_fwd::Params walk_inputs(Case const& c, Problem const& pr, Solved const& s) {
  kn::walk_a_fwd::Params p;
  p.problem = pr.kernel_problem();
  p.q = pr.q16.data();
  p.k = pr.k16.data();
  p.v = pr.v16.data();
  p.a = s.a.data();
  p.gcum = s.gcum.data();
  p.beta = s.beta.data();
  p.h0 = c.states ? pr.h0_32.data() : nullptr;
  return p;
}

// The FP64 reference's inputs for a case (the same rounded values the kernels see).
cake::ref::Inputs reference_inputs(Case const& c, Problem const& pr) {
  return {pr.q.data(), pr.k.data(),    pr.v.data(),
          pr.g.data(), pr.beta.data(), c.states ? pr.h0.data() : nullptr,
          pr.scale};
}

void forward_draw(Case const& c, std::mt19937& rng, Pool& pool) {
  Problem const pr = cake::gdn_testing::make_problem(c, rng);
  Solved const s = run_kkt_solve(pr);
  auto o = poisoned<bf16>(pr.BT * pr.HV * K);
  auto ht = poisoned<float>(pr.states_size());
  kn::walk_a_fwd::Params p = walk_inputs(c, pr, s);
  p.o = o.data();
  p.ht = ht.data();
  EXPECT_EQ(kn::walk_a_fwd::launch<kn::ScalarDecay>(p, nullptr), cudaSuccess);

  std::vector<double> ro(pr.BT * pr.HV * K), rht(pr.states_size());
  cake::ref::Inputs const in = reference_inputs(c, pr);
  cake::ref::chunked_forward(pr.shape(), in, cake::ref::Outputs{ro.data(), rht.data()});
  pool[0].second.add(widen(o), ro);
  pool[1].second.add(ht, rht);
}

// The reverse stage's gradients (walk_a_bwd): dq, dk summed over each q/k head's value heads, dv,
// dg, dbeta, dh0.
struct Grads {
  std::vector<float> dq, dk;
  std::vector<bf16> dv;
  std::vector<float> dg, dbeta, dh0;
};

// The h-walk (the forward walk without o): bf16 h per chunk.
std::vector<bf16> run_h_walk(Case const& c, Problem const& pr, Solved const& s) {
  auto h = poisoned<bf16>(pr.kernel_problem().num_slots * pr.HV * K * K);
  kn::walk_a_fwd::Params p = walk_inputs(c, pr, s);
  p.h = h.data();
  EXPECT_EQ(kn::walk_a_fwd::launch<kn::ScalarDecay>(p, nullptr), cudaSuccess);
  return h;
}

// The reverse stage on h: the walk, or (split) the dS-walk and then the chunk pass. dq and dk in
// turn over the value heads (tickets and turns zeroed, as the op clears them), or with `unordered`
// added in any order into sums zeroed first (where the group has several value heads).
Grads run_reverse(Case const& c, Problem const& pr, Solved const& s, std::vector<bf16> const& h,
                  bool split, bool unordered = false) {
  kn::Problem const kp = pr.kernel_problem();
  bool const sums = unordered && pr.HV > pr.H;
  Grads g{sums ? std::vector<float>(pr.BT * pr.H * K, 0.f) : poisoned<float>(pr.BT * pr.H * K),
          sums ? std::vector<float>(pr.BT * pr.H * K, 0.f) : poisoned<float>(pr.BT * pr.H * K),
          poisoned<bf16>(pr.BT * pr.HV * K),
          poisoned<float>(pr.BT * pr.HV),
          poisoned<float>(pr.BT * pr.HV),
          poisoned<float>(pr.states_size())};
  std::vector<int> order(kn::walk_a_bwd::walk_order_size(kp), 0);
  kn::walk_a_bwd::Params p;
  p.problem = kp;
  p.q = pr.q16.data();
  p.k = pr.k16.data();
  p.v = pr.v16.data();
  p.dout = pr.dout16.data();
  p.a = s.a.data();
  p.gcum = s.gcum.data();
  p.beta = s.beta.data();
  p.h = h.data();
  p.dht = c.states ? pr.dht32.data() : nullptr;
  p.dq = g.dq.data();
  p.dk = g.dk.data();
  p.order = pr.HV > pr.H && !sums ? order.data() : nullptr;
  p.unordered_sum = sums;
  p.dv = g.dv.data();
  p.dbeta = g.dbeta.data();
  p.dg = g.dg.data();
  p.dh0 = g.dh0.data();
  p.eo_split = c.states;
  if (!split) {
    EXPECT_EQ(kn::walk_a_bwd::launch<kn::ScalarDecay>(p, nullptr), cudaSuccess);
    return g;
  }
  // the dS-walk writes no dq or dk and takes no ticket: the chunk pass takes them all
  auto ds_end = poisoned<float>(kp.num_slots * pr.HV * K * K);
  EXPECT_EQ(kn::walk_a_bwd::launch_ds_walk<kn::ScalarDecay>(
                kn::walk_a_bwd::ds_walk_params(p, ds_end.data()), nullptr),
            cudaSuccess);
  EXPECT_TRUE(std::all_of(order.begin(), order.end(), [](int x) { return x == 0; }));
  EXPECT_EQ(kn::walk_a_bwd::launch<kn::ScalarDecay>(
                kn::walk_a_bwd::chunk_pass_params(p, ds_end.data()), nullptr),
            cudaSuccess);
  return g;
}

void backward_draw(Case const& c, std::mt19937& rng, Pool& pool, bool split) {
  Problem const pr = cake::gdn_testing::make_problem(c, rng);
  Solved const s = run_kkt_solve(pr);
  Grads const g = run_reverse(c, pr, s, run_h_walk(c, pr, s), split);

  std::vector<double> rq(pr.BT * pr.H * K), rk(rq.size()), rv(pr.BT * pr.HV * K), rg(pr.BT * pr.HV),
      rbeta(rg.size()), rh0(pr.states_size());
  cake::ref::Inputs const in = reference_inputs(c, pr);
  cake::ref::chunked_backward(
      pr.shape(), in, cake::ref::OutputGrads{pr.dout.data(), c.states ? pr.dht.data() : nullptr},
      cake::ref::InputGrads{rq.data(), rk.data(), rv.data(), rg.data(), rbeta.data(), rh0.data()});
  pool[0].second.add(g.dq, rq);
  pool[1].second.add(g.dk, rk);
  pool[2].second.add(widen(g.dv), rv);
  pool[3].second.add(g.dg, rg);
  pool[4].second.add(g.dbeta, rbeta);
  pool[5].second.add(g.dh0, rh0);
}

template <class T>
bool bitwise_equal(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// More than 32 documents: the walks' longest-first ranking and find_chunk switch to their
// many-document paths (in order; a binary search over cu_seqlens).
Case many_documents() {
  Case c{"34 short + 1 long", {}, 1, 2};
  for (int i = 0; i < 34; ++i) c.docs.push_back(1 + 3 * (i % 12));
  c.docs.push_back(150);
  return c;
}

// The cases of the GPU check (tests/cuda/walk_bwd_check.cu), some smaller: the emulator runs
// ~10^4x slower than the GPU. Not the strong-decay ones: at g = -20 the true dg is ~e^-20 and a
// few elements carry its norm, so on 136 tokens x 2 heads its relative error has a long tail
// (kernels that pass the GPU check reached 1.0e-2 once in 16 seeds); the GPU check's 266 x 4
// gave a largest 3.8e-3 in 16.
std::vector<Case> cases() {
  return {
      {"docs 1,63,64,65,130 GVA 1/2", {1, 63, 64, 65, 130}},
      {"docs 65,70 H=HV=2", {65, 70}, 2, 2},
      {"docs 1,65,130 GVA 1/4", {1, 65, 130}, 1, 4},  // four value heads in turn per chunk
      {"docs 65,200,1 g=-20", {65, 200, 1}, 2, 4, -20.f, -20.f},
      {"docs 65,200,1 g=0", {65, 200, 1}, 2, 4, 0.f, 0.f},
      {"docs 130 beta~0", {130}, 1, 2, -1.f, 0.f, 1e-4f, 2e-4f},
      {"docs 130 beta~1", {130}, 1, 2, -1.f, 0.f, 1.f - 2e-4f, 1.f - 1e-4f},
      {"docs 64,65 no states", {64, 65}, 1, 2, -1.f, 0.f, 0.f, 1.f, false},
      many_documents(),
  };
}

std::mt19937 seeded() {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  return std::mt19937(seed);
}

TEST(EmulatedGdn, ForwardMatchesTheFp64Reference) {
  std::mt19937 rng = seeded();
  for (Case const& c : cases()) {
    Pool pool{{"o", {}}, {"ht", {}}};
    for (int d = 0; d < kDraws; ++d) forward_draw(c, rng, pool);
    expect_pass("forward", c, pool);
  }
}

TEST(EmulatedGdn, BackwardStagesMatchTheFp64Reference) {
  std::mt19937 rng = seeded();
  for (Case const& c : cases()) {
    Pool pool{{"dq", {}}, {"dk", {}}, {"dv", {}}, {"dg", {}}, {"dbeta", {}}, {"dh0", {}}};
    for (int d = 0; d < kDraws; ++d) backward_draw(c, rng, pool, false);
    expect_pass("backward", c, pool);
  }
}

// The split form (the dS-walk, then the chunk pass) against the FP64 reference, on cases whose
// reverse walks are few and long (where the op splits): groups of 2 and 4 value heads (the pass's
// dq and dk in turn over them), g = -20, and no states.
TEST(EmulatedGdn, SplitBackwardStagesMatchTheFp64Reference) {
  std::mt19937 rng = seeded();
  std::vector<Case> const all = cases();
  for (Case const& c : {all[0], all[2], all[3], all[7]}) {
    Pool pool{{"dq", {}}, {"dk", {}}, {"dv", {}}, {"dg", {}}, {"dbeta", {}}, {"dh0", {}}};
    for (int d = 0; d < kDraws; ++d) backward_draw(c, rng, pool, true);
    expect_pass("split backward", c, pool);
  }
}

// The split form gives every gradient of the walk bitwise: the dS-walk's products are the walk's,
// the chunk pass's step is the walk's on the dS it stored (fp32, for <dS, h>: stored as bf16, dg
// moves, in the short chunks' last rows and, at g = 0, where e^{G_last} leaves <dS, h> its weight
// in every chunk), and its dq and dk sums add each slot's value heads in the walk's order. Few and
// many documents, lengths 1, 63, 64, 65 and 200, groups of 1, 2 and 4 value heads, with and
// without h0 and dht. The emulator runs the blocks one after another in their index order and
// throws where a turn awaited is not yet passed (tests/emu/ptx.hpp): a CTA that would wait on a
// later ticket fails here.
TEST(EmulatedGdn, SplitBackwardIsTheWalkBitwise) {
  std::mt19937 rng = seeded();
  std::vector<Case> split_cases = {
      {"docs 1,63,64,65,200 GVA 1/2", {1, 63, 64, 65, 200}},
      {"docs 200,65 no states", {200, 65}, 1, 2, -1.f, 0.f, 0.f, 1.f, false},
      {"docs 64 H=HV=2", {64}, 2, 2},
      {"docs 1,65,130 GVA 1/4", {1, 65, 130}, 1, 4},
      {"docs 65,200,1 g=0", {65, 200, 1}, 2, 4, 0.f, 0.f},
      many_documents(),
  };
  for (Case c : split_cases) {
    Problem const pr = cake::gdn_testing::make_problem(c, rng);
    Solved const s = run_kkt_solve(pr);
    std::vector<bf16> const h = run_h_walk(c, pr, s);
    Grads const walk = run_reverse(c, pr, s, h, false);
    Grads const split = run_reverse(c, pr, s, h, true);
    EXPECT_TRUE(bitwise_equal(walk.dq, split.dq)) << c.name << ": dq";
    EXPECT_TRUE(bitwise_equal(walk.dk, split.dk)) << c.name << ": dk";
    EXPECT_TRUE(bitwise_equal(walk.dv, split.dv)) << c.name << ": dv";
    EXPECT_TRUE(bitwise_equal(walk.dg, split.dg)) << c.name << ": dg";
    EXPECT_TRUE(bitwise_equal(walk.dbeta, split.dbeta)) << c.name << ": dbeta";
    EXPECT_TRUE(bitwise_equal(walk.dh0, split.dh0)) << c.name << ": dh0";
  }
}

// Params::unordered_sum in both forms: dq and dk added by every value head at once into zeroed
// sums, within the gate of the FP64 reference; the other gradients bitwise the ordered walk's.
TEST(EmulatedGdn, UnorderedSumsInBothFormsMatchTheFp64Reference) {
  std::mt19937 rng = seeded();
  for (Case const& c : {Case{"docs 1,65,130 GVA 1/4", {1, 65, 130}, 1, 4},
                        Case{"docs 63,64,200 GVA 2/4", {63, 64, 200}, 2, 4}}) {
    Problem const pr = cake::gdn_testing::make_problem(c, rng);
    Solved const s = run_kkt_solve(pr);
    std::vector<bf16> const h = run_h_walk(c, pr, s);
    Grads const ordered = run_reverse(c, pr, s, h, false);
    std::vector<double> rq(pr.BT * pr.H * K), rk(rq.size()), rv(pr.BT * pr.HV * K),
        rg(pr.BT * pr.HV), rbeta(rg.size()), rh0(pr.states_size());
    cake::ref::chunked_backward(
        pr.shape(), reference_inputs(c, pr),
        cake::ref::OutputGrads{pr.dout.data(), c.states ? pr.dht.data() : nullptr},
        cake::ref::InputGrads{rq.data(), rk.data(), rv.data(), rg.data(), rbeta.data(),
                              rh0.data()});
    for (bool const split : {false, true}) {
      Grads const g = run_reverse(c, pr, s, h, split, true);
      Pool pool{{"dq", {}}, {"dk", {}}};
      pool[0].second.add(g.dq, rq);
      pool[1].second.add(g.dk, rk);
      expect_pass(split ? "split, unordered sums" : "walk, unordered sums", c, pool);
      EXPECT_TRUE(bitwise_equal(ordered.dv, g.dv) && bitwise_equal(ordered.dg, g.dg) &&
                  bitwise_equal(ordered.dbeta, g.dbeta) && bitwise_equal(ordered.dh0, g.dh0))
          << c.name << ", split " << split;
    }
  }
}

}  // namespace
