// The KDA forward (kkt_solve<ChannelDecay> -> walk_a_fwd<ChannelDecay>) on the CPU emulator,
// against the FP64 chunked reference with a per-channel gate: o and the final state on the cases
// of kda_emu_testing.hpp (initial states given). Also the walk's other two uses: with h per chunk
// (saved mode) and without o (the backward's h-walk), whose h must equal the first's bitwise (the
// same products in the same order), every chunk's h written. Outputs poisoned (NaN) before each
// run.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "emu/kda_emu_testing.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "ref/chunked.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::Errors;
using cake::emu_testing::K;
using cake::emu_testing::poisoned;
using cake::emu_testing::widen;
using cake::gdn_testing::Problem;
using cake::kda_emu_testing::KdaCase;
namespace kn = cake::kernels;
namespace ref = cake::ref;

// kkt_solve<ChannelDecay>'s outputs for a problem and its gate g (fp32 [BT, HV, K]).
struct ChunkPass {
  std::vector<float> gcum, beta;
  std::vector<bf16> a, aqk, qg, kg, kbar;
};

ChunkPass run_chunk_pass(Problem const& pr, std::vector<float> const& g32) {
  size_t const keys = pr.BT * pr.HV * K;
  size_t const rows = pr.BT * pr.HV * kn::kChunk;
  ChunkPass out{poisoned<float>(keys), poisoned<float>(pr.BT * pr.HV), poisoned<bf16>(rows),
                poisoned<bf16>(rows),  poisoned<bf16>(keys),           poisoned<bf16>(keys),
                poisoned<bf16>(keys)};
  kn::kkt_solve::Params p;
  p.problem = pr.kernel_problem();
  p.k = pr.k16.data();
  p.q = pr.q16.data();
  p.g = g32.data();
  p.beta = pr.beta32.data();
  p.gcum = out.gcum.data();
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
  p.gcum = c.gcum.data();
  p.beta = c.beta.data();
  p.h0 = states ? pr.h0_32.data() : nullptr;
  p.qg = c.qg.data();
  p.kg = c.kg.data();
  p.kbar = c.kbar.data();
  p.aqk = c.aqk.data();
  return p;
}

struct Pool {
  Errors o, ht;
};

// Rows of h per chunk that a walk must write: slot_base(n) + j for chunk j of document n.
bool chunk_states_equal(Problem const& pr, std::vector<bf16> const& a, std::vector<bf16> const& b,
                        int64_t* written) {
  kn::Problem const kp = pr.kernel_problem();
  size_t const state = size_t{K} * K;
  *written = 0;
  for (int n = 0; n < pr.N; ++n) {
    int64_t const chunks = (pr.cu[n + 1] - pr.cu[n] + kn::kChunk - 1) / kn::kChunk;
    for (int64_t j = 0; j < chunks; ++j)
      for (int hv = 0; hv < pr.HV; ++hv) {
        size_t const at = ((kp.slot_base(n) + j) * pr.HV + hv) * state;
        if (std::memcmp(a.data() + at, b.data() + at, state * sizeof(bf16)) != 0) return false;
        for (size_t i = 0; i < state; ++i)
          if (!std::isfinite(__bfloat162float(a[at + i]))) return false;
        ++*written;
      }
  }
  return true;
}

void forward_draw(KdaCase const& kc, std::mt19937& rng, Pool& pool) {
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
    Pool pool;
    for (int d = 0; d < 2; ++d) forward_draw(kc, rng, pool);
    char line[256];
    std::snprintf(line, sizeof line, "%s, g %s: o %.1e/%.1e ht %.1e/%.1e", kc.shape.name.c_str(),
                  kc.gate_name, pool.o.rel_rms(), pool.o.max_rel(), pool.ht.rel_rms(),
                  pool.ht.max_rel());
    std::printf("%s\n", line);
    EXPECT_TRUE(pool.o.pass() && pool.ht.pass()) << line;
  }
}

}  // namespace
