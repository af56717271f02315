// kkt_solve with the per-channel decay (ChannelDecay, KDA) on the CPU emulator, against the FP64
// reference's stages 1 and 2 (chunk_local_cumsum, chunk_solve_forward): G's last row of each
// chunk [num_slots, HV, K] and the gated inverse A = T [BT, HV, 64]; and against FP64 formed here
// from the reference's G: the output's intra-chunk attention P_ij = s sum_c q_ic k_jc e^{G_ic -
// G_jc} (i >= j) and the walks' operands qg, kg, kbar. On the cases of kda_emu_testing.hpp, whose
// gates break a naive e^{G} e^{-G} split. Outputs poisoned (NaN) before each run. And the
// persistent CTAs (each taking many items, the next head's loads under the solve) against one item
// per CTA, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "emu/kda_emu_testing.hpp"
#include "emu/runtime.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "ref/chunk_cumsum.hpp"
#include "ref/chunk_solve.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::Errors;
using cake::emu_testing::expect_pass;
using cake::emu_testing::K;
using cake::emu_testing::poisoned;
using cake::emu_testing::widen;
using cake::gdn_testing::Case;
using cake::gdn_testing::Problem;
using cake::kda_emu_testing::KdaCase;
namespace kn = cake::kernels;
namespace ref = cake::ref;

struct Pooled {
  Errors G, A, strict, P, qg, kg, kbar;  // strict: A's strictly lower part alone
};

// The walks' operands in FP64 from the reference's G: q o e^G, k o e^G, k o e^{G_last - G}
// (G_last: G of the chunk's last token), each [BT, HV, K].
struct Operands {
  std::vector<double> qg, kg, kbar;
};
Operands reference_operands(Problem const& pr, std::vector<double> const& G) {
  size_t const n = pr.BT * pr.HV * K;
  Operands out{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  for (int d = 0; d < pr.N; ++d)
    for (int64_t t = pr.cu[d]; t < pr.cu[d + 1]; ++t) {
      int64_t const r = (t - pr.cu[d]) % kn::kChunk;
      int64_t const last = std::min<int64_t>(t - r + kn::kChunk, pr.cu[d + 1]) - 1;
      for (int hv = 0; hv < pr.HV; ++hv)
        for (int c = 0; c < K; ++c) {
          int64_t const at = (t * pr.HV + hv) * K + c;
          int64_t const qk = (t * pr.H + hv / (pr.HV / pr.H)) * K + c;
          double const g = G[at];
          out.qg[at] = pr.q[qk] * std::exp(g);
          out.kg[at] = pr.k[qk] * std::exp(g);
          out.kbar[at] = pr.k[qk] * std::exp(G[(last * pr.HV + hv) * K + c] - g);
        }
    }
  return out;
}

// P in FP64 from the reference's G: row t of its chunk's P, columns j <= r (zeros above).
std::vector<double> reference_p(Problem const& pr, std::vector<double> const& G) {
  std::vector<double> P(pr.BT * pr.HV * kn::kChunk, 0.0);
  for (int n = 0; n < pr.N; ++n)
    for (int64_t t = pr.cu[n]; t < pr.cu[n + 1]; ++t) {
      int64_t const r = (t - pr.cu[n]) % kn::kChunk;
      int64_t const t0 = t - r;
      for (int hv = 0; hv < pr.HV; ++hv) {
        int const h = hv / (pr.HV / pr.H);
        for (int64_t j = 0; j <= r; ++j) {
          double sum = 0;
          for (int c = 0; c < K; ++c)
            sum += pr.q[(t * pr.H + h) * K + c] * pr.k[((t0 + j) * pr.H + h) * K + c] *
                   std::exp(G[(t * pr.HV + hv) * K + c] - G[((t0 + j) * pr.HV + hv) * K + c]);
          P[(t * pr.HV + hv) * kn::kChunk + j] = pr.scale * sum;
        }
      }
    }
  return P;
}

// kkt_solve's outputs for problem pr (g32: its gate, [BT, HV, K]), poisoned (NaN) until a launch
// writes them, and the launch's parameters on them. solves: A and P are formed (else the walks'
// operands alone, as the backward of inverse mode asks); with_qg: qg is formed.
struct Outputs {
  std::vector<float> glast, beta;
  std::vector<bf16> a, aqk, qg, kg, kbar;

  Outputs(Problem const& pr, size_t gate_size)
      : glast(poisoned<float>(pr.kernel_problem().num_slots * pr.HV * K)),
        beta(poisoned<float>(pr.BT * pr.HV)),
        a(poisoned<bf16>(pr.BT * pr.HV * kn::kChunk)),
        aqk(poisoned<bf16>(a.size())),
        qg(poisoned<bf16>(gate_size)),
        kg(poisoned<bf16>(gate_size)),
        kbar(poisoned<bf16>(gate_size)) {}

  kn::kkt_solve::Params params(Problem const& pr, std::vector<float> const& g32, bool solves,
                               bool with_qg) {
    kn::kkt_solve::Params p;
    p.problem = pr.kernel_problem();
    p.k = pr.k16.data();
    p.g = g32.data();
    p.beta = pr.beta32.data();
    p.glast = glast.data();
    p.beta_f32 = beta.data();
    p.q = pr.q16.data();
    if (solves) {
      p.a = a.data();
      p.aqk = aqk.data();
    }
    if (with_qg) p.qg = qg.data();
    p.kg = kg.data();
    p.kbar = kbar.data();
    return p;
  }
};

void draw(KdaCase const& kc, std::mt19937& rng, Pooled& pool) {
  Problem const pr = cake::gdn_testing::make_problem(kc.shape, rng);
  std::vector<double> g = cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng);
  std::vector<float> const g32 = cake::gdn_testing::to_f32(g);

  Outputs out(pr, g.size());
  kn::kkt_solve::Params const p = out.params(pr, g32, true, true);
  ASSERT_EQ(kn::kkt_solve::launch<kn::ChannelDecay>(p, nullptr), cudaSuccess);

  ref::Shape shape = pr.shape();
  shape.gate = ref::Gate::kChannel;
  ref::ChunkTiling const tiling(shape, kn::kChunk);
  std::vector<double> rG(g.size()), rA(out.a.size());
  ref::chunk_local_cumsum(shape, tiling, g.data(), rG.data());
  // k as the kernel reads it: q/k head h of value head hv (the reference's layout is the same)
  ref::chunk_solve_forward(shape, tiling, pr.k.data(), pr.beta.data(), rG.data(), rA.data());

  // G's last row of each chunk, at its slot (slots that hold no chunk are not written)
  std::vector<float> got_last;
  std::vector<double> want_last;
  kn::Problem const kp = pr.kernel_problem();
  for (int n = 0; n < pr.N; ++n)
    for (int64_t j = 0; pr.cu[n] + j * kn::kChunk < pr.cu[n + 1]; ++j) {
      int64_t const last = std::min<int64_t>(pr.cu[n] + (j + 1) * kn::kChunk, pr.cu[n + 1]) - 1;
      for (int hv = 0; hv < pr.HV; ++hv)
        for (int c = 0; c < K; ++c) {
          got_last.push_back(out.glast[((kp.slot_base(n) + j) * pr.HV + hv) * K + c]);
          want_last.push_back(rG[(last * pr.HV + hv) * K + c]);
        }
    }
  pool.G.add(got_last, want_last);
  std::vector<double> got = widen(out.a);
  pool.A.add(got, rA);
  std::vector<double> strict_got, strict_ref;
  for (int64_t t = 0; t < pr.BT; ++t) {
    // row r of its chunk: strictly lower columns are j < r
    int64_t doc = 0;
    while (pr.cu[doc + 1] <= t) ++doc;
    int64_t const r = (t - pr.cu[doc]) % kn::kChunk;
    for (int hv = 0; hv < pr.HV; ++hv)
      for (int64_t j = 0; j < r; ++j) {
        int64_t const at = (t * pr.HV + hv) * kn::kChunk + j;
        strict_got.push_back(got[at]);
        strict_ref.push_back(rA[at]);
      }
  }
  pool.strict.add(strict_got, strict_ref);
  pool.P.add(widen(out.aqk), reference_p(pr, rG));
  Operands const ro = reference_operands(pr, rG);
  pool.qg.add(widen(out.qg), ro.qg);
  pool.kg.add(widen(out.kg), ro.kg);
  pool.kbar.add(widen(out.kbar), ro.kbar);
  EXPECT_EQ(std::vector<float>(out.beta.begin(), out.beta.end()), pr.beta32);
}

TEST(EmulatedKdaKktSolve, OutputsMatchTheFp64Reference) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (KdaCase const& kc : cake::kda_emu_testing::cases()) {
    Pooled pool;
    for (int d = 0; d < 2; ++d) draw(kc, rng, pool);
    expect_pass(kc.label(), {{"G", pool.G},
                             {"A", pool.A},
                             {"strict", pool.strict},
                             {"P", pool.P},
                             {"qg", pool.qg},
                             {"kg", pool.kg},
                             {"kbar", pool.kbar}});
  }
}

// Every output of one launch, as bytes: G's last rows, beta, A, P, qg, kg, kbar (poisoned where
// the launch does not write).
std::vector<char> run_bytes(Problem const& pr, std::vector<float> const& g32, bool solves,
                            bool with_qg) {
  Outputs outputs(pr, g32.size());
  EXPECT_EQ(
      kn::kkt_solve::launch<kn::ChannelDecay>(outputs.params(pr, g32, solves, with_qg), nullptr),
      cudaSuccess);
  std::vector<char> out;
  auto const add = [&](auto const& v) {
    char const* const at = reinterpret_cast<char const*>(v.data());
    out.insert(out.end(), at, at + v.size() * sizeof(v[0]));
  };
  add(outputs.glast);
  add(outputs.beta);
  add(outputs.a);
  add(outputs.aqk);
  add(outputs.qg);
  add(outputs.kg);
  add(outputs.kbar);
  return out;
}

// The launch takes two CTAs per SM, each walking items blockIdx.x, + gridDim.x, ...: with one or
// three SMs (2 or 6 CTAs) every CTA takes many items, crossing q/k heads and documents, and loads
// each next head (and item) under the solve of the one before. The outputs must be those of one
// CTA per item (132 SMs: more CTAs than items here), bit for bit, with and without the solve (the
// backward of inverse mode forms the walks' operands alone) and without qg.
TEST(EmulatedKdaKktSolve, PersistentCtasAreBitwiseOneItemPerCta) {
  std::mt19937 rng(7);
  std::vector<KdaCase> cases = cake::kda_emu_testing::cases();
  cases.push_back({{"docs 200,64,1,33 H=2 GVA 3", {200, 64, 1, 33}, 2, 6},
                   "U(-1,0), -20 on one channel",
                   cake::kda_emu_testing::one_channel_strong()});
  // 40 documents: find_chunk's binary search (32 or more), not the warp's one round of loads
  std::vector<int> docs(40);
  for (int n = 0; n < 40; ++n) docs[n] = 1 + 37 * n % 90;
  cases.push_back(
      {{"40 docs of 1 to 90", docs, 1, 2}, "U(-1,0)", cake::kda_emu_testing::uniform(-1, 0)});
  for (KdaCase const& kc : cases) {
    Problem const pr = cake::gdn_testing::make_problem(kc.shape, rng);
    std::vector<double> const g = cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng);
    std::vector<float> const g32(g.begin(), g.end());
    for (auto const [solves, with_qg] : {std::pair{true, true}, {false, true}, {true, false}}) {
      std::vector<char> const one = run_bytes(pr, g32, solves, with_qg);
      for (int const sms : {1, 3}) {
        cake::emu::ScopedMultiprocessorCount const count(sms);
        std::vector<char> const got = run_bytes(pr, g32, solves, with_qg);
        EXPECT_TRUE(got.size() == one.size() &&
                    std::memcmp(got.data(), one.data(), one.size()) == 0)
            << kc.label() << ", " << sms << " SMs, solves " << solves << ", qg " << with_qg;
      }
    }
  }
}

}  // namespace
