// The KDA kernels on the CPU emulator, on the cases of kda_emu_testing.hpp (initial states given).
// The forward (kkt_solve<ChannelDecay> -> walk_a_fwd<ChannelDecay>) against the FP64 chunked
// reference with a per-channel gate: o and the final state; and the walk's other two uses, with h
// per chunk (saved mode) and without o (the backward's h-walk), whose h must equal the first's
// bitwise (the same products in the same order), every chunk's h written. The intra pass
// (intra_bwd) against the FP64 model's (ref/kda_walk_model.hpp), fed the model's reverse-walk
// outputs. The whole backward (the chunk pass, the h-walk, walk_a_bwd<ChannelDecay>, intra_bwd,
// the sum over value heads) against the FP64 chunked reference. Outputs poisoned (NaN) before
// each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>

#include "emu/kda_emu_testing.hpp"
#include "emu/runtime.hpp"
#include "kernels/intra_bwd/launch.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "ref/chunked.hpp"
#include "ref/kda_walk_model.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::Errors;
using cake::emu_testing::expect_pass;
using cake::emu_testing::K;
using cake::emu_testing::poisoned;
using cake::emu_testing::sum_over_groups;
using cake::emu_testing::widen;
using cake::gdn_testing::Problem;
using cake::kda_emu_testing::KdaCase;
namespace kn = cake::kernels;
namespace ref = cake::ref;
namespace model = cake::ref::kda_model;

// kkt_solve<ChannelDecay>'s outputs for a problem and its gate g (fp32 [BT, HV, K]).
struct ChunkPass {
  std::vector<float> glast, beta;
  std::vector<bf16> a, aqk, qg, kg, kbar;
};

ChunkPass run_chunk_pass(Problem const& pr, std::vector<float> const& g32) {
  size_t const keys = pr.BT * pr.HV * K;
  size_t const rows = pr.BT * pr.HV * kn::kChunk;
  size_t const slot_keys = pr.kernel_problem().num_slots * pr.HV * K;
  ChunkPass out{poisoned<float>(slot_keys), poisoned<float>(pr.BT * pr.HV), poisoned<bf16>(rows),
                poisoned<bf16>(rows),       poisoned<bf16>(keys),           poisoned<bf16>(keys),
                poisoned<bf16>(keys)};
  kn::kkt_solve::Params p;
  p.problem = pr.kernel_problem();
  p.k = pr.k16.data();
  p.q = pr.q16.data();
  p.g = g32.data();
  p.beta = pr.beta32.data();
  p.glast = out.glast.data();
  p.beta_f32 = out.beta.data();
  p.a = out.a.data();
  p.aqk = out.aqk.data();
  p.qg = out.qg.data();
  p.kg = out.kg.data();
  p.kbar = out.kbar.data();
  EXPECT_EQ(kn::kkt_solve::launch<kn::ChannelDecay>(p, nullptr), cudaSuccess);
  return out;
}

kn::walk_a_fwd::Params walk_inputs(Problem const& pr, ChunkPass const& c, bool states) {
  kn::walk_a_fwd::Params p;
  p.problem = pr.kernel_problem();
  p.v = pr.v16.data();
  p.a = c.a.data();
  p.glast = c.glast.data();
  p.beta = c.beta.data();
  p.h0 = states ? pr.h0_32.data() : nullptr;
  p.qg = c.qg.data();
  p.kg = c.kg.data();
  p.kbar = c.kbar.data();
  p.aqk = c.aqk.data();
  return p;
}

struct ForwardPool {
  Errors o, ht;
};

// Rows of h per chunk that a walk must write: slot_base(n) + j for chunk j of document n.
bool chunk_states_equal(Problem const& pr, std::vector<bf16> const& a, std::vector<bf16> const& b,
                        int64_t* written) {
  size_t const state = size_t{K} * K;
  *written = 0;
  auto const same_and_written = [&](int, int64_t, int, size_t at) {
    if (std::memcmp(a.data() + at, b.data() + at, state * sizeof(bf16)) != 0)
      return std::string("differs");
    for (size_t i = 0; i < state; ++i)
      if (!std::isfinite(__bfloat162float(a[at + i]))) return std::string("not written");
    ++*written;
    return std::string();
  };
  return cake::emu_testing::visit_chunk_states(pr, same_and_written).empty();
}

void forward_draw(KdaCase const& kc, std::mt19937& rng, ForwardPool& pool) {
  Problem const pr = cake::gdn_testing::make_problem(kc.shape, rng);
  std::vector<double> g = cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng);
  std::vector<float> const g32 = cake::gdn_testing::to_f32(g);
  ChunkPass const c = run_chunk_pass(pr, g32);
  bool const states = kc.shape.states;
  kn::Problem const kp = pr.kernel_problem();
  size_t const h_size = kp.num_slots * pr.HV * K * K;

  // saved mode's walk: o, ht and h per chunk
  auto o = poisoned<bf16>(pr.BT * pr.HV * K);
  auto ht = poisoned<float>(pr.states_size());
  auto h = poisoned<bf16>(h_size);
  kn::walk_a_fwd::Params p = walk_inputs(pr, c, states);
  p.o = o.data();
  p.ht = ht.data();
  p.h = h.data();
  EXPECT_EQ(kn::walk_a_fwd::launch<kn::ChannelDecay>(p, nullptr), cudaSuccess);

  // the h-walk: h per chunk, no o
  auto h_walk = poisoned<bf16>(h_size);
  kn::walk_a_fwd::Params hp = walk_inputs(pr, c, states);
  hp.h = h_walk.data();
  hp.aqk = nullptr;
  EXPECT_EQ(kn::walk_a_fwd::launch<kn::ChannelDecay>(hp, nullptr), cudaSuccess);
  int64_t written = 0;
  EXPECT_TRUE(chunk_states_equal(pr, h, h_walk, &written))
      << kc.shape.name << ": the h-walk's h differs from the forward's, or is not finite";
  EXPECT_GT(written, 0);

  ref::Shape shape = pr.shape();
  shape.gate = ref::Gate::kChannel;
  std::vector<double> ro(pr.BT * pr.HV * K), rht(pr.states_size());
  ref::Inputs const in{pr.q.data(), pr.k.data(),    pr.v.data(),
                       g.data(),    pr.beta.data(), states ? pr.h0.data() : nullptr,
                       pr.scale};
  ref::chunked_forward(shape, in, ref::Outputs{ro.data(), rht.data()});
  pool.o.add(widen(o), ro);
  pool.ht.add(ht, rht);
}

TEST(EmulatedKda, ForwardMatchesTheFp64Reference) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (KdaCase const& kc : cake::kda_emu_testing::cases()) {
    ForwardPool pool;
    for (int d = 0; d < 2; ++d) forward_draw(kc, rng, pool);
    expect_pass(kc.label(), {{"o", pool.o}, {"ht", pool.ht}});
  }
}

// The intra pass's inputs (the model's reverse walk, rounded to fp32) and the model's outputs for
// them, per value head.
struct IntraCase {
  std::vector<float> dqk, dl, dqg, dkg, dkbar, dgamma, dbeta_walk;
  std::vector<double> dq, dk, dg, dbeta;
};

IntraCase model_intra(Problem const& pr, std::vector<double> const& g, bool states,
                      std::mt19937& rng) {
  kn::Problem const kp = pr.kernel_problem();
  int64_t const keys = pr.BT * pr.HV * K, rows = pr.BT * pr.HV * kn::kChunk;
  IntraCase x{std::vector<float>(rows),          std::vector<float>(rows),
              std::vector<float>(keys),          std::vector<float>(keys),
              std::vector<float>(keys),          std::vector<float>(kp.num_slots * pr.HV * K, 0.f),
              std::vector<float>(pr.BT * pr.HV), std::vector<double>(keys),
              std::vector<double>(keys),         std::vector<double>(keys),
              std::vector<double>(pr.BT * pr.HV)};
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int n = 0; n < pr.N; ++n)
    for (int hv = 0; hv < pr.HV; ++hv) {
      int const head = hv / (pr.HV / pr.H);
      int64_t const bos = pr.cu[n], eos = pr.cu[n + 1];
      int64_t const chunks = (eos - bos + kn::kChunk - 1) / kn::kChunk;
      auto pass = [&](int64_t j) {
        int64_t const t0 = bos + j * kn::kChunk, c = std::min<int64_t>(kn::kChunk, eos - t0);
        return model::chunk_pass(model::rows(pr.q.data(), t0, c, pr.H, head, K),
                                 model::rows(pr.k.data(), t0, c, pr.H, head, K),
                                 model::rows(pr.beta.data(), t0, c, pr.HV, hv, 1),
                                 model::rows(g.data(), t0, c, pr.HV, hv, K), c, K, pr.scale);
      };
      std::vector<model::Mat> hs(chunks);
      model::Mat h(K * K, 0.0);
      if (states)
        h.assign(pr.h0.begin() + (n * pr.HV + hv) * K * K,
                 pr.h0.begin() + (n * pr.HV + hv + 1) * K * K);
      for (int64_t j = 0; j < chunks; ++j) {
        int64_t const t0 = bos + j * kn::kChunk;
        hs[j] = h;
        h = model::walk_step(pass(j), model::rows(pr.v.data(), t0, pass(j).c, pr.HV, hv, K), h, K,
                             pr.scale)
                .next;
      }
      model::Mat dS(K * K);
      for (double& v : dS) v = normal(rng);
      for (int64_t j = chunks - 1; j >= 0; --j) {
        int64_t const t0 = bos + j * kn::kChunk;
        model::ChunkPass const f = pass(j);
        int64_t const c = f.c;
        model::WalkStep const w =
            model::walk_step(f, model::rows(pr.v.data(), t0, c, pr.HV, hv, K), hs[j], K, pr.scale);
        model::ReverseStep const r = model::reverse_step(
            f, w, hs[j], model::rows(pr.dout.data(), t0, c, pr.HV, hv, K), dS, K, pr.scale);
        model::IntraGrads const ig = model::intra_backward(f, r, pr.scale);
        int64_t const slot = kp.slot_base(n) + j;
        for (int64_t y = 0; y < K; ++y) x.dgamma[(slot * pr.HV + hv) * K + y] = r.dgamma[y];
        for (int64_t i = 0; i < c; ++i) {
          int64_t const row = (t0 + i) * pr.HV + hv;
          x.dbeta_walk[row] = static_cast<float>(r.dbeta_walk[i]);
          x.dbeta[row] = ig.dbeta[i];
          for (int64_t jj = 0; jj < kn::kChunk; ++jj) {
            bool const in = jj < c;
            x.dqk[row * kn::kChunk + jj] =
                in ? static_cast<float>(pr.scale * r.dP[i * c + jj]) : 0.f;
            x.dl[row * kn::kChunk + jj] = in ? static_cast<float>(r.dL[i * c + jj]) : 0.f;
          }
          for (int64_t y = 0; y < K; ++y) {
            int64_t const at = row * K + y;
            x.dqg[at] = static_cast<float>(r.dqg[i * K + y]);
            x.dkg[at] = static_cast<float>(r.dkg[i * K + y]);
            x.dkbar[at] = static_cast<float>(r.dkbar[i * K + y]);
            x.dq[at] = ig.dq[i * K + y];
            x.dk[at] = ig.dk[i * K + y];
          }
        }
        for (int64_t y = 0; y < K; ++y) {  // dg: the reverse cumsum of dG
          double acc = 0;
          for (int64_t i = c - 1; i >= 0; --i) {
            acc += ig.dG[i * K + y];
            x.dg[((t0 + i) * pr.HV + hv) * K + y] = acc;
          }
        }
        dS = r.dS_prev;
      }
    }
  return x;
}

struct IntraPool {
  Errors dq, dk, dg, dbeta;
};

// intra_bwd's outputs on x's hand-over: dq, dk [BT, H, K] (summed over each q/k head's value
// heads, bf16: no L2 norm here), dg [BT, HV, K], dbeta [BT, HV], poisoned (NaN) before the
// launch, as its fp32 sums before the last value head.
struct IntraOutputs {
  std::vector<bf16> dq, dk;
  std::vector<float> dg, dbeta;
};
IntraOutputs run_intra(Problem const& pr, std::vector<float> const& g32, IntraCase const& x) {
  size_t const keys = pr.BT * pr.HV * K;
  size_t const qk_keys = pr.BT * pr.H * K;
  IntraOutputs out{poisoned<bf16>(qk_keys), poisoned<bf16>(qk_keys), poisoned<float>(keys),
                   poisoned<float>(pr.BT * pr.HV)};
  std::vector<float> dq_sum = poisoned<float>(qk_keys), dk_sum = poisoned<float>(qk_keys);
  kn::intra_bwd::Params p;
  p.problem = pr.kernel_problem();
  p.q = pr.q16.data();
  p.k = pr.k16.data();
  p.g = g32.data();
  p.beta = pr.beta32.data();
  p.dqk = x.dqk.data();
  p.dl = x.dl.data();
  p.dqg = x.dqg.data();
  p.dkg = x.dkg.data();
  p.dkbar = x.dkbar.data();
  p.dgamma = x.dgamma.data();
  p.dbeta_walk = x.dbeta_walk.data();
  p.dq_sum = dq_sum.data();
  p.dk_sum = dk_sum.data();
  p.dq = out.dq.data();
  p.dk = out.dk.data();
  p.dg = out.dg.data();
  p.dbeta = out.dbeta.data();
  EXPECT_EQ(kn::intra_bwd::launch(p, nullptr), cudaSuccess);
  return out;
}

void intra_draw(KdaCase const& kc, std::mt19937& rng, IntraPool& pool) {
  Problem const pr = cake::gdn_testing::make_problem(kc.shape, rng);
  std::vector<double> g = cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng);
  std::vector<float> const g32 = cake::gdn_testing::to_f32(g);
  IntraCase const x = model_intra(pr, g, kc.shape.states, rng);
  IntraOutputs const got = run_intra(pr, g32, x);
  pool.dq.add(got.dq, sum_over_groups(x.dq, pr.BT, pr.H, pr.HV));
  pool.dk.add(got.dk, sum_over_groups(x.dk, pr.BT, pr.H, pr.HV));
  pool.dg.add(got.dg, x.dg);
  pool.dbeta.add(got.dbeta, x.dbeta);
}

TEST(EmulatedKda, IntraPassMatchesTheFp64Model) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  cake::emu::ScopedMultiprocessorCount const sms(3);  // each CTA walks several items
  for (KdaCase const& kc : cake::kda_emu_testing::cases()) {
    IntraPool pool;
    intra_draw(kc, rng, pool);
    expect_pass(kc.label(),
                {{"dq", pool.dq}, {"dk", pool.dk}, {"dg", pool.dg}, {"dbeta", pool.dbeta}});
  }
}

// intra_bwd's CTAs walk items blockIdx.x, + gridDim.x, ... (one CTA an SM), loading each next
// item's tiles beside the dbeta and dg of the one before: with 1, 2, 3 or 5 SMs every CTA takes
// many items, crossing q/k heads, documents and short chunks. The outputs must be those of one
// CTA per item (132 SMs: more than the items here), bit for bit.
TEST(EmulatedKda, IntraPassPersistentCtasAreBitwiseOneItemPerCta) {
  std::mt19937 rng(5);
  std::vector<KdaCase> cases = cake::kda_emu_testing::cases();
  std::vector<int> docs(40);  // 40 documents of 1 to 90 tokens: find_chunk's binary search
  for (int n = 0; n < 40; ++n) docs[n] = 1 + 37 * n % 90;
  cases.push_back(
      {{"40 docs of 1 to 90", docs, 1, 2}, "U(-1,0)", cake::kda_emu_testing::uniform(-1, 0)});
  auto const same = [](auto const& a, auto const& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  for (KdaCase const& kc : cases) {
    Problem const pr = cake::gdn_testing::make_problem(kc.shape, rng);
    std::vector<double> g = cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng);
    std::vector<float> const g32 = cake::gdn_testing::to_f32(g);
    IntraCase const x = model_intra(pr, g, kc.shape.states, rng);
    ASSERT_LE(int64_t{pr.kernel_problem().num_slots} * pr.H, 132) << kc.label();
    IntraOutputs const one = run_intra(pr, g32, x);
    for (int const count : {1, 2, 3, 5}) {
      cake::emu::ScopedMultiprocessorCount const sms(count);
      IntraOutputs const got = run_intra(pr, g32, x);
      EXPECT_TRUE(same(got.dq, one.dq) && same(got.dk, one.dk) && same(got.dg, one.dg) &&
                  same(got.dbeta, one.dbeta))
          << kc.label() << ", " << count << " SMs";
    }
  }
}

struct BackwardPool {
  Errors dq, dk, dv, dg, dbeta, dh0;
  cake::emu_testing::Pool named() const {
    return {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dg", dg}, {"dbeta", dbeta}, {"dh0", dh0}};
  }
};

// What walk_a_bwd<ChannelDecay> writes: dv, dh0 and the intra pass's inputs.
struct WalkGrads {
  std::vector<float> dqk, dl, dqg, dkg, dkbar, dgamma, dbeta_walk;
  std::vector<bf16> dv;
  std::vector<float> dh0;
};

// The h-walk: bf16 h per chunk.
std::vector<bf16> run_h_walk(Problem const& pr, ChunkPass const& c, bool states) {
  auto h = poisoned<bf16>(pr.kernel_problem().num_slots * pr.HV * K * K);
  kn::walk_a_fwd::Params hp = walk_inputs(pr, c, states);
  hp.h = h.data();
  hp.aqk = nullptr;
  EXPECT_EQ(kn::walk_a_fwd::launch<kn::ChannelDecay>(hp, nullptr), cudaSuccess);
  return h;
}

// The reverse walk on h: the walk, or (split) the dS-walk and then the chunk pass.
WalkGrads run_reverse(Problem const& pr, ChunkPass const& c, std::vector<bf16> const& h,
                      bool states, bool split) {
  kn::Problem const kp = pr.kernel_problem();
  size_t const keys = pr.BT * pr.HV * K, rows = pr.BT * pr.HV * kn::kChunk;
  WalkGrads w{poisoned<float>(rows),
              poisoned<float>(rows),
              poisoned<float>(keys),
              poisoned<float>(keys),
              poisoned<float>(keys),
              poisoned<float>(kp.num_slots * pr.HV * K),
              poisoned<float>(pr.BT * pr.HV),
              poisoned<bf16>(pr.BT * pr.HV * K),
              poisoned<float>(pr.states_size())};
  kn::walk_a_bwd::Params p;
  p.problem = kp;
  p.q = c.qg.data();
  p.k = c.kg.data();
  p.v = pr.v16.data();
  p.dout = pr.dout16.data();
  p.a = c.a.data();
  p.glast = c.glast.data();
  p.beta = c.beta.data();
  p.h = h.data();
  p.dht = states ? pr.dht32.data() : nullptr;
  p.dv = w.dv.data();
  p.dh0 = w.dh0.data();
  p.kbar = c.kbar.data();
  p.aqk = c.aqk.data();
  p.dqk = w.dqk.data();
  p.dl = w.dl.data();
  p.dqg = w.dqg.data();
  p.dkg = w.dkg.data();
  p.dkbar = w.dkbar.data();
  p.dgamma = w.dgamma.data();
  p.dbeta_walk = w.dbeta_walk.data();
  if (split) {
    auto ds_end = poisoned<float>(kp.num_slots * pr.HV * K * K);
    EXPECT_EQ(kn::walk_a_bwd::launch_ds_walk<kn::ChannelDecay>(
                  kn::walk_a_bwd::ds_walk_params(p, ds_end.data()), nullptr),
              cudaSuccess);
    EXPECT_EQ(kn::walk_a_bwd::launch<kn::ChannelDecay>(
                  kn::walk_a_bwd::chunk_pass_params(p, ds_end.data()), nullptr),
              cudaSuccess);
  } else {
    EXPECT_EQ(kn::walk_a_bwd::launch<kn::ChannelDecay>(p, nullptr), cudaSuccess);
  }
  return w;
}

void backward_draw(KdaCase const& kc, std::mt19937& rng, BackwardPool& pool, bool split = false) {
  Problem const pr = cake::gdn_testing::make_problem(kc.shape, rng);
  std::vector<double> g = cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng);
  std::vector<float> const g32 = cake::gdn_testing::to_f32(g);
  bool const states = kc.shape.states;
  ChunkPass const c = run_chunk_pass(pr, g32);
  kn::Problem const kp = pr.kernel_problem();
  size_t const keys = pr.BT * pr.HV * K;
  // the reverse walk; dgamma of slots that hold no chunk is never read
  WalkGrads const w = run_reverse(pr, c, run_h_walk(pr, c, states), states, split);
  auto dq16 = poisoned<bf16>(pr.BT * pr.H * K), dk16 = poisoned<bf16>(pr.BT * pr.H * K);
  auto dq_sum = poisoned<float>(pr.BT * pr.H * K), dk_sum = poisoned<float>(pr.BT * pr.H * K);
  auto dg = poisoned<float>(keys);
  auto dbeta = poisoned<float>(pr.BT * pr.HV);
  {
    kn::intra_bwd::Params p;
    p.problem = kp;
    p.q = pr.q16.data();
    p.k = pr.k16.data();
    p.g = g32.data();
    p.beta = pr.beta32.data();
    p.dqk = w.dqk.data();
    p.dl = w.dl.data();
    p.dqg = w.dqg.data();
    p.dkg = w.dkg.data();
    p.dkbar = w.dkbar.data();
    p.dgamma = w.dgamma.data();
    p.dbeta_walk = w.dbeta_walk.data();
    p.dq_sum = dq_sum.data();
    p.dk_sum = dk_sum.data();
    p.dq = dq16.data();
    p.dk = dk16.data();
    p.dg = dg.data();
    p.dbeta = dbeta.data();
    EXPECT_EQ(kn::intra_bwd::launch(p, nullptr), cudaSuccess);
  }
  std::vector<double> const dq = widen(dq16);
  std::vector<double> const dk = widen(dk16);

  ref::Shape shape = pr.shape();
  shape.gate = ref::Gate::kChannel;
  std::vector<double> rq(dq.size()), rk(dq.size()), rv(pr.BT * pr.HV * K), rg(keys),
      rbeta(pr.BT * pr.HV), rh0(pr.states_size());
  ref::Inputs const in{pr.q.data(), pr.k.data(),    pr.v.data(),
                       g.data(),    pr.beta.data(), states ? pr.h0.data() : nullptr,
                       pr.scale};
  ref::chunked_backward(
      shape, in, ref::OutputGrads{pr.dout.data(), states ? pr.dht.data() : nullptr},
      ref::InputGrads{rq.data(), rk.data(), rv.data(), rg.data(), rbeta.data(), rh0.data()});
  pool.dq.add(dq, rq);
  pool.dk.add(dk, rk);
  pool.dv.add(widen(w.dv), rv);
  pool.dg.add(dg, rg);
  pool.dbeta.add(dbeta, rbeta);
  pool.dh0.add(w.dh0, rh0);
}

TEST(EmulatedKda, BackwardMatchesTheFp64Reference) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (KdaCase const& kc : cake::kda_emu_testing::cases()) {
    BackwardPool pool;
    for (int d = 0; d < 2; ++d) backward_draw(kc, rng, pool);
    expect_pass(kc.label(), pool.named());
  }
}

// The split form (the dS-walk, then the chunk pass) with the intra pass, against the FP64
// reference.
TEST(EmulatedKda, SplitBackwardMatchesTheFp64Reference) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<KdaCase> const all = cake::kda_emu_testing::cases();
  for (KdaCase const& kc : {all[0], all[2]}) {
    BackwardPool pool;
    for (int d = 0; d < 2; ++d) backward_draw(kc, rng, pool, true);
    expect_pass("split " + kc.label(), pool.named());
  }
}

// The split form writes what the walk writes, bit for bit (kernel.cuh; GDN's test says why).
TEST(EmulatedKda, SplitBackwardIsTheWalkBitwise) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<KdaCase> const all = cake::kda_emu_testing::cases();
  KdaCase no_states = all[1];
  no_states.shape.states = false;
  no_states.shape.name += " no states";
  for (KdaCase const& kc : {all[0], all[2], no_states}) {
    Problem const pr = cake::gdn_testing::make_problem(kc.shape, rng);
    std::vector<double> g = cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng);
    std::vector<float> const g32 = cake::gdn_testing::to_f32(g);
    ChunkPass const c = run_chunk_pass(pr, g32);
    bool const states = kc.shape.states;
    std::vector<bf16> const h = run_h_walk(pr, c, states);
    WalkGrads const walk = run_reverse(pr, c, h, states, false);
    WalkGrads const split = run_reverse(pr, c, h, states, true);
    auto same = [](auto const& a, auto const& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    EXPECT_TRUE(same(walk.dqk, split.dqk) && same(walk.dl, split.dl)) << kc.label();
    EXPECT_TRUE(same(walk.dqg, split.dqg) && same(walk.dkg, split.dkg) &&
                same(walk.dkbar, split.dkbar))
        << kc.label();
    EXPECT_TRUE(same(walk.dgamma, split.dgamma) && same(walk.dbeta_walk, split.dbeta_walk))
        << kc.label();
    EXPECT_TRUE(same(walk.dv, split.dv) && same(walk.dh0, split.dh0)) << kc.label();
  }
}

}  // namespace
