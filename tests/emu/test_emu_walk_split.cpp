// The forward walk's split walks (walk_a_fwd/split.hpp: a CTA per 64-column slice of a walk)
// against its whole walks, on the CPU emulator: the emulated SM count set so that split.hpp's
// rule takes one shape and then the other, for GDN and KDA, in the walk's three uses
// (o and the final state; o, the final state and h per chunk; the h-walk: h per chunk and its
// flags). Every output must be the same bitwise, and written: outputs are poisoned (NaN) before
// each run, and o, the final state and every chunk's h must come back finite. The same for the
// backward's dS-walk (walk_a_bwd::launch_ds_walk, split by dS's columns on the same rule): every
// chunk's dS and dh0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "emu/kda_emu_testing.hpp"
#include "emu/runtime.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/walk_a_fwd/split.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::K;
using cake::emu_testing::poisoned;
using cake::emu_testing::visit_chunk_states;
using cake::gdn_testing::Case;
using cake::gdn_testing::Problem;
namespace kn = cake::kernels;
namespace fwd = cake::kernels::walk_a_fwd;
namespace bwd = cake::kernels::walk_a_bwd;

// kkt_solve's outputs the walk reads, for either decay (ScalarDecay: gcum, beta, A; ChannelDecay:
// glast, beta, A, P, qg, kg, kbar).
struct Operands {
  std::vector<float> gcum, glast, beta;
  std::vector<bf16> a, aqk, qg, kg, kbar;
};

template <class Decay>
Operands run_kkt_solve(Problem const& pr, std::vector<float> const& g32) {
  kn::Problem const kp = pr.kernel_problem();
  size_t const keys = pr.BT * pr.HV * K;
  size_t const rows = pr.BT * pr.HV * kn::kChunk;
  Operands out;
  out.beta = poisoned<float>(pr.BT * pr.HV);
  out.a = poisoned<bf16>(rows);
  kn::kkt_solve::Params p;
  p.problem = kp;
  p.k = pr.k16.data();
  p.g = g32.data();
  p.beta = pr.beta32.data();
  p.beta_f32 = out.beta.data();
  p.a = out.a.data();
  if constexpr (Decay::kGatedKkt) {
    out.glast = poisoned<float>(kp.num_slots * pr.HV * K);
    out.aqk = poisoned<bf16>(rows);
    out.qg = poisoned<bf16>(keys);
    out.kg = poisoned<bf16>(keys);
    out.kbar = poisoned<bf16>(keys);
    p.q = pr.q16.data();
    p.glast = out.glast.data();
    p.aqk = out.aqk.data();
    p.qg = out.qg.data();
    p.kg = out.kg.data();
    p.kbar = out.kbar.data();
  } else {
    out.gcum = poisoned<float>(pr.BT * pr.HV);
    p.gcum = out.gcum.data();
  }
  EXPECT_EQ(kn::kkt_solve::launch<Decay>(p, nullptr), cudaSuccess);
  return out;
}

template <class Decay>
fwd::Params walk_inputs(Problem const& pr, Operands const& x, bool states) {
  fwd::Params p;
  p.problem = pr.kernel_problem();
  p.q = pr.q16.data();
  p.k = pr.k16.data();
  p.v = pr.v16.data();
  p.a = x.a.data();
  p.beta = x.beta.data();
  p.h0 = states ? pr.h0_32.data() : nullptr;
  if constexpr (Decay::kGatedKkt) {
    p.q = nullptr;
    p.k = nullptr;
    p.glast = x.glast.data();
    p.qg = x.qg.data();
    p.kg = x.kg.data();
    p.kbar = x.kbar.data();
  } else {
    p.gcum = x.gcum.data();
  }
  return p;
}

// One run's outputs: o [BT, HV, K], ht [N, HV, K, K], h [num_slots, HV, K, K], flags [N, HV].
struct Outputs {
  std::vector<bf16> o, h;
  std::vector<float> ht;
  std::vector<int> flags;
};

enum class Use { kForward, kSaved, kHWalk };

// The walk in one use with the emulated device's SMs set to num_sms.
template <class Decay>
Outputs run_walk(Problem const& pr, Operands const& x, bool states, Use use, int num_sms) {
  kn::Problem const kp = pr.kernel_problem();
  Outputs out{poisoned<bf16>(pr.BT * pr.HV * K), poisoned<bf16>(kp.num_slots * pr.HV * K * K),
              poisoned<float>(pr.states_size()), std::vector<int>(int64_t{pr.N} * pr.HV, 0)};
  fwd::Params p = walk_inputs<Decay>(pr, x, states);
  if (use != Use::kHWalk) {
    p.o = out.o.data();
    p.ht = states ? out.ht.data() : nullptr;
    if constexpr (Decay::kGatedKkt) p.aqk = x.aqk.data();
  } else {
    p.walk_done = out.flags.data();
  }
  if (use != Use::kForward) p.h = out.h.data();
  cake::emu::ScopedMultiprocessorCount const count(num_sms);
  EXPECT_EQ(fwd::launch<Decay>(p, nullptr), cudaSuccess);
  return out;
}

template <class T>
bool all_finite(T const* x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(static_cast<double>(x[i]))) return false;
  return true;
}

// Where the split run's outputs differ from the whole run's or were left unwritten ("" if none).
std::string compare(Problem const& pr, Outputs const& whole, Outputs const& split, bool states,
                    Use use) {
  if (use != Use::kHWalk) {
    if (!all_finite(whole.o.data(), whole.o.size())) return "o not all written (whole)";
    if (std::memcmp(whole.o.data(), split.o.data(), whole.o.size() * sizeof(bf16)) != 0)
      return "o differs";
    if (states) {
      if (!all_finite(whole.ht.data(), whole.ht.size())) return "ht not all written (whole)";
      if (std::memcmp(whole.ht.data(), split.ht.data(), whole.ht.size() * sizeof(float)) != 0)
        return "ht differs";
    }
  }
  if (use != Use::kForward) {
    size_t const state = size_t{K} * K;
    std::string verdict = visit_chunk_states(pr, [&](int, int64_t, int, size_t at) {
      if (!all_finite(split.h.data() + at, state)) return std::string("h not all written (split)");
      if (std::memcmp(whole.h.data() + at, split.h.data() + at, state * sizeof(bf16)) != 0)
        return std::string("h differs");
      return std::string();
    });
    if (!verdict.empty()) return verdict;
  }
  if (use == Use::kHWalk)  // every walk's flag counts its h's two 64-column slices (params.hpp)
    for (size_t i = 0; i < whole.flags.size(); ++i)
      if (whole.flags[i] != kn::kSlicesOfH || split.flags[i] != kn::kSlicesOfH)
        return "walk " + std::to_string(i) + "'s flag is " + std::to_string(whole.flags[i]) +
               " whole, " + std::to_string(split.flags[i]) + " split";
  return "";
}

// Cases: documents of 1, 63, 64, 65 tokens and more, GVA 1 to 4, with and without states.
std::vector<Case> cases() {
  return {
      {"docs 1,63,64,65,130 GVA 2", {1, 63, 64, 65, 130}, 1, 2},
      {"docs 65,200,1 H=2 GVA 2", {65, 200, 1}, 2, 4},
      {"docs 64,65 GVA 3 no states", {64, 65}, 1, 3, -1.f, 0.f, 0.f, 1.f, false},
  };
}

// SM counts at which the rule takes each shape for a case's walks.
int whole_sms(Problem const& pr) { return pr.N * pr.HV; }
int split_sms(Problem const& pr) { return kn::kSlicesOfH * pr.N * pr.HV; }

// The case's gate in g's shape for Decay: the problem's own for a scalar decay, one drawn per
// channel (KDA's shape) for a gated one.
template <class Decay>
std::vector<float> gate_for(Case const& c, Problem const& pr, std::mt19937& rng) {
  if constexpr (Decay::kGatedKkt) {
    cake::kda_emu_testing::KdaCase const kc{c, "U(-1,0)", cake::kda_emu_testing::uniform(-1, 0)};
    std::vector<double> g = cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng);
    return cake::gdn_testing::to_f32(g);
  } else {
    return pr.g32;
  }
}

// Each case drawn with a fresh seed (printed), checked to keep its walks whole at whole_sms and
// split them at split_sms, and handed with kkt_solve's operands for it to check(c, pr, x).
template <class Decay, class Check>
void for_each_case(Check const& check) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (Case const& c : cases()) {
    Problem const pr = cake::gdn_testing::make_problem(c, rng);
    ASSERT_FALSE(fwd::split_walks(int64_t{pr.N} * pr.HV, whole_sms(pr)));
    ASSERT_TRUE(fwd::split_walks(int64_t{pr.N} * pr.HV, split_sms(pr)));
    check(c, pr, run_kkt_solve<Decay>(pr, gate_for<Decay>(c, pr, rng)));
  }
}

template <class Decay>
void expect_split_matches_whole(char const* decay) {
  for_each_case<Decay>([&](Case const& c, Problem const& pr, Operands const& x) {
    for (Use use : {Use::kForward, Use::kSaved, Use::kHWalk}) {
      Outputs const whole = run_walk<Decay>(pr, x, c.states, use, whole_sms(pr));
      Outputs const split = run_walk<Decay>(pr, x, c.states, use, split_sms(pr));
      std::string const verdict = compare(pr, whole, split, c.states, use);
      char const* const names[] = {"o, ht", "o, ht, h", "h-walk"};
      std::printf("%s %s, %s: %s\n", decay, c.name.c_str(), names[static_cast<int>(use)],
                  verdict.empty() ? "split == whole" : verdict.c_str());
      EXPECT_TRUE(verdict.empty()) << decay << " " << c.name << ": " << verdict;
    }
  });
}

// The dS-walk's outputs: dS of every chunk's end ds_end [num_slots, HV, K, K], dh0 [N, HV, K, K].
struct DsOutputs {
  std::vector<float> ds_end, dh0;
};

// The dS-walk with the emulated device's SMs set to num_sms (GDN with states: eO as hi + lo, as
// the op sets it).
template <class Decay>
DsOutputs run_ds_walk(Problem const& pr, Operands const& x, bool states, int num_sms) {
  kn::Problem const kp = pr.kernel_problem();
  DsOutputs out{poisoned<float>(kp.num_slots * pr.HV * K * K), poisoned<float>(pr.states_size())};
  bwd::Params p;
  p.problem = kp;
  p.dout = pr.dout16.data();
  p.a = x.a.data();
  p.beta = x.beta.data();
  p.dht = states ? pr.dht32.data() : nullptr;
  p.dh0 = out.dh0.data();
  p.ds_end_out = out.ds_end.data();
  if constexpr (Decay::kGatedKkt) {
    p.q = x.qg.data();
    p.k = x.kg.data();
    p.kbar = x.kbar.data();
    p.aqk = x.aqk.data();
    p.glast = x.glast.data();
  } else {
    p.q = pr.q16.data();
    p.k = pr.k16.data();
    p.gcum = x.gcum.data();
    p.eo_split = states;
  }
  cake::emu::ScopedMultiprocessorCount const count(num_sms);
  EXPECT_EQ(bwd::launch_ds_walk<Decay>(p, nullptr), cudaSuccess);
  return out;
}

// Where the split dS-walk's outputs differ from the whole one's or were left unwritten ("" if
// none); `states` counts the states compared.
std::string compare_ds(Problem const& pr, DsOutputs const& whole, DsOutputs const& split,
                       int& states) {
  size_t const state = size_t{K} * K;
  if (!all_finite(whole.dh0.data(), whole.dh0.size())) return "dh0 not all written (whole)";
  if (!all_finite(split.dh0.data(), split.dh0.size())) return "dh0 not all written (split)";
  if (std::memcmp(whole.dh0.data(), split.dh0.data(), whole.dh0.size() * sizeof(float)) != 0)
    return "dh0 differs";
  states += static_cast<int>(whole.dh0.size() / state);
  return visit_chunk_states(pr, [&](int n, int64_t j, int hv, size_t at) {
    if (!all_finite(whole.ds_end.data() + at, state))
      return std::string("dS not all written (whole)");
    if (!all_finite(split.ds_end.data() + at, state))
      return std::string("dS not all written (split)");
    if (std::memcmp(whole.ds_end.data() + at, split.ds_end.data() + at, state * sizeof(float)) != 0)
      return "dS of document " + std::to_string(n) + "'s chunk " + std::to_string(j) +
             ", value head " + std::to_string(hv) + " differs";
    ++states;
    return std::string();
  });
}

template <class Decay>
void expect_split_ds_walk_matches_whole(char const* decay) {
  for_each_case<Decay>([&](Case const& c, Problem const& pr, Operands const& x) {
    DsOutputs const whole = run_ds_walk<Decay>(pr, x, c.states, whole_sms(pr));
    DsOutputs const split = run_ds_walk<Decay>(pr, x, c.states, split_sms(pr));
    int states = 0;
    std::string const verdict = compare_ds(pr, whole, split, states);
    std::printf("%s %s, dS-walk: %s (%d states of 128 x 128)\n", decay, c.name.c_str(),
                verdict.empty() ? "split == whole" : verdict.c_str(), states);
    EXPECT_TRUE(verdict.empty()) << decay << " " << c.name << ": " << verdict;
  });
}

TEST(EmulatedWalkSplit, RuleSplitsAllWalksUpToHalfTheSms) {
  EXPECT_TRUE(fwd::split_walks(1, 132));
  EXPECT_TRUE(fwd::split_walks(64, 132));
  EXPECT_TRUE(fwd::split_walks(66, 132));
  EXPECT_FALSE(fwd::split_walks(67, 132));
  EXPECT_FALSE(fwd::split_walks(192, 132));
  EXPECT_FALSE(fwd::split_walks(0, 132));
  EXPECT_FALSE(fwd::split_walks(1, 1));
}

TEST(EmulatedWalkSplit, GdnSplitWalksMatchWholeWalksBitwise) {
  expect_split_matches_whole<kn::ScalarDecay>("gdn");
}

TEST(EmulatedWalkSplit, KdaSplitWalksMatchWholeWalksBitwise) {
  expect_split_matches_whole<kn::ChannelDecay>("kda");
}

TEST(EmulatedWalkSplit, GdnSplitDsWalkMatchesWholeDsWalkBitwise) {
  expect_split_ds_walk_matches_whole<kn::ScalarDecay>("gdn");
}

TEST(EmulatedWalkSplit, KdaSplitDsWalkMatchesWholeDsWalkBitwise) {
  expect_split_ds_walk_matches_whole<kn::ChannelDecay>("kda");
}

}  // namespace
