// The GDN and KDA GPU ops (src/ops/cuda/gdn_cuda.cpp, kda_cuda.cpp: the stages in order, the
// saved set and workspace carved from the caller's buffers) on the CPU emulator, against the FP64
// chunked reference: the three modes of the saved set, bitwise equal to each other; guard bytes
// after the exact workspace and saved set the size queries ask for stay untouched; outputs
// poisoned first. KDA's gate per channel is drawn as logsigmoid(N(0, 1)), one value in 16 down
// to -20 (kda_emu_testing.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor.hpp"
#include "emu/kda_emu_testing.hpp"
#include "ops/gdn_cuda.hpp"
#include "ops/kda_cuda.hpp"
#include "ref/preprocess.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::Errors;
using cake::emu_testing::K;
using cake::emu_testing::poisoned;
using cake::emu_testing::widen;
using cake::gdn_testing::Case;
using cake::gdn_testing::Problem;

constexpr size_t kGuard = 4096;
constexpr unsigned char kGuardByte = 0xa5;

// A dense view of a host buffer that the op takes for a CUDA tensor (the launches are emulated).
template <class T>
cakeTensor_t view(T const* data, cakeDtype_t dtype, std::vector<int64_t> const& shape) {
  return cake::dense_view(const_cast<T*>(data), dtype, cakeCUDA, shape);
}

// bytes + kGuard, 256-byte aligned at the start (the saved set's rule), guard bytes filled.
struct Guarded {
  std::vector<unsigned char> raw;
  unsigned char* data = nullptr;
  size_t bytes = 0;
  explicit Guarded(size_t n) : raw(n + kGuard + 256), bytes(n) {
    auto const addr = reinterpret_cast<uintptr_t>(raw.data());
    data = raw.data() + (256 - addr % 256) % 256;
    std::memset(data + n, kGuardByte, kGuard);
  }
  bool guard_intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (data[bytes + i] != kGuardByte) return false;
    return true;
  }
};

struct Grads {
  std::vector<bf16> dq, dk, dv;
  std::vector<float> dg, dbeta, dh0;
};

// KDA's gate of a problem: g [BT, HV, K] as the reference and (fp32) the kernels read it. Absent
// (kda false): GDN, with the problem's own g [BT, HV].
struct ChannelGate {
  bool kda = false;
  std::vector<double> g;
  std::vector<float> g32;
};

ChannelGate channel_gate(Problem const& pr, std::mt19937& rng) {
  cake::kda_emu_testing::KdaCase const kc{{}, "", cake::kda_emu_testing::unbounded()};
  ChannelGate gate{true, cake::kda_emu_testing::draw_gate(kc, pr.BT, pr.HV, rng), {}};
  gate.g32 = cake::gdn_testing::to_f32(gate.g);
  return gate;
}

// The op's entry points for a variant (gdn_cuda.hpp, kda_cuda.hpp).
struct OpEntries {
  decltype(&cake::ops::gdn_cuda_saved_bytes) saved_bytes;
  decltype(&cake::ops::gdn_cuda_forward_workspace_bytes) forward_workspace_bytes;
  decltype(&cake::ops::gdn_cuda_forward) forward;
  decltype(&cake::ops::gdn_cuda_backward_workspace_bytes) backward_workspace_bytes;
  decltype(&cake::ops::gdn_cuda_backward) backward;
};
OpEntries entries(bool kda) {
  namespace ops = cake::ops;
  if (kda)
    return {ops::kda_cuda_saved_bytes, ops::kda_cuda_forward_workspace_bytes, ops::kda_cuda_forward,
            ops::kda_cuda_backward_workspace_bytes, ops::kda_cuda_backward};
  return {ops::gdn_cuda_saved_bytes, ops::gdn_cuda_forward_workspace_bytes, ops::gdn_cuda_forward,
          ops::gdn_cuda_backward_workspace_bytes, ops::gdn_cuda_backward};
}

// Forward then backward through the op in one mode; o, ht and the gradients.
struct OpRun {
  std::vector<bf16> o;
  std::vector<float> ht;
  Grads grads;
};

// mode: options.save_for_backward (0 recompute, 1 saved, 2 inverse); all_grads = false: dq, dk
// and dh0 absent (as a caller that freezes q, k and the initial state); l2: with the q/k L2 norm;
// gate: KDA's (else GDN).
OpRun run_op(Problem const& pr, int mode, bool all_grads = true, bool l2 = false,
             ChannelGate const& gate = {}) {
  int64_t const BT = pr.BT;
  int64_t const gate_width = gate.kda ? K : 1;
  OpEntries const op = entries(gate.kda);
  cakeOptions_t options{};
  options.struct_size = sizeof options;
  options.variant = gate.kda ? cakeKda : cakeGdn;
  options.scale = pr.scale;
  options.save_for_backward = mode;
  options.use_qk_l2norm = l2 ? 1 : 0;
  cakeTensor_t const q = view(pr.q16.data(), cakeBfloat16, {1, BT, pr.H, K});
  cakeTensor_t const k = view(pr.k16.data(), cakeBfloat16, {1, BT, pr.H, K});
  cakeTensor_t const v = view(pr.v16.data(), cakeBfloat16, {1, BT, pr.HV, K});
  cakeTensor_t const g = gate.kda ? view(gate.g32.data(), cakeFloat32, {1, BT, pr.HV, K})
                                  : view(pr.g32.data(), cakeFloat32, {1, BT, pr.HV});
  cakeTensor_t const beta = view(pr.beta32.data(), cakeFloat32, {1, BT, pr.HV});
  cakeTensor_t const h0 = view(pr.h0_32.data(), cakeFloat32, {pr.N, pr.HV, K, K});
  cakeTensor_t const cu = view(pr.cu.data(), cakeInt32, {pr.N + 1});
  OpRun run{poisoned<bf16>(BT * pr.HV * K), poisoned<float>(pr.states_size()), {}};

  // The inputs both passes take, in fields of the same names
  auto const set_inputs = [&](auto& args) {
    args.q = q;
    args.k = k;
    args.v = v;
    args.g = g;
    args.beta = beta;
    args.initial_state = h0;
    args.cu_seqlens = cu;
  };
  cakeForwardArgs_t fa{};
  set_inputs(fa);
  fa.o = view(run.o.data(), cakeBfloat16, {1, BT, pr.HV, K});
  fa.final_state = view(run.ht.data(), cakeFloat32, {pr.N, pr.HV, K, K});
  Guarded saved(op.saved_bytes(options, q, v, cu));
  Guarded fws(op.forward_workspace_bytes(options, fa));
  op.forward(options, fa, saved.bytes != 0 ? saved.data : nullptr, fws.data, fws.bytes, nullptr);
  EXPECT_TRUE(saved.guard_intact()) << "the forward wrote past the saved set";
  EXPECT_TRUE(fws.guard_intact()) << "the forward wrote past its workspace";

  Grads& gr = run.grads;
  gr.dq = poisoned<bf16>(BT * pr.H * K);
  gr.dk = poisoned<bf16>(BT * pr.H * K);
  gr.dv = poisoned<bf16>(BT * pr.HV * K);
  gr.dg = poisoned<float>(BT * pr.HV * gate_width);
  gr.dbeta = poisoned<float>(BT * pr.HV);
  gr.dh0 = poisoned<float>(pr.states_size());
  cakeBackwardArgs_t ba{};
  set_inputs(ba);
  ba.dout = view(pr.dout16.data(), cakeBfloat16, {1, BT, pr.HV, K});
  ba.dht = view(pr.dht32.data(), cakeFloat32, {pr.N, pr.HV, K, K});
  ba.dq = view(gr.dq.data(), cakeBfloat16, {1, BT, pr.H, K});
  ba.dk = view(gr.dk.data(), cakeBfloat16, {1, BT, pr.H, K});
  ba.dv = view(gr.dv.data(), cakeBfloat16, {1, BT, pr.HV, K});
  ba.dg = gate.kda ? view(gr.dg.data(), cakeFloat32, {1, BT, pr.HV, K})
                   : view(gr.dg.data(), cakeFloat32, {1, BT, pr.HV});
  ba.dbeta = view(gr.dbeta.data(), cakeFloat32, {1, BT, pr.HV});
  ba.dh0 = view(gr.dh0.data(), cakeFloat32, {pr.N, pr.HV, K, K});
  if (!all_grads) ba.dq = ba.dk = ba.dh0 = cakeTensor_t{};
  Guarded bws(op.backward_workspace_bytes(options, ba));
  op.backward(options, ba, saved.bytes != 0 ? saved.data : nullptr, bws.data, bws.bytes, nullptr);
  EXPECT_TRUE(bws.guard_intact()) << "the backward wrote past its workspace";
  EXPECT_TRUE(saved.guard_intact()) << "the backward wrote past the saved set";
  return run;
}

// A problem of case c drawn from a fresh seed, printed so that a failure can be replayed.
Problem fresh_problem(Case const& c) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  return cake::gdn_testing::make_problem(c, rng);
}

template <class T>
bool bitwise_equal(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The three modes agree bit for bit, and the recompute mode's results pass the gate against the
// FP64 chunked reference (on q, k normalised in FP64 when l2, with the norm's backward); kda: with
// a gate per channel.
void check_modes(Case const& c, bool l2, bool kda = false) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Problem pr = cake::gdn_testing::make_problem(c, rng);
  if (l2) {  // q, k rows of norms 0.2 .. 5 (make_problem's are unit rows), so a norm left out shows
    std::uniform_real_distribution<double> norm(0.2, 5.0);
    for (auto* x : {&pr.q, &pr.k})
      for (int64_t r = 0; r < pr.BT * pr.H; ++r) {
        double const f = norm(rng);
        for (int i = 0; i < K; ++i) (*x)[r * K + i] *= f;
      }
    pr.q16 = cake::gdn_testing::to_bf16(pr.q);
    pr.k16 = cake::gdn_testing::to_bf16(pr.k);
  }
  ChannelGate const gate = kda ? channel_gate(pr, rng) : ChannelGate{};
  OpRun const recompute = run_op(pr, 0, true, l2, gate);
  Grads const& a = recompute.grads;
  for (int mode : {1, 2}) {
    OpRun const saved = run_op(pr, mode, true, l2, gate);
    EXPECT_TRUE(bitwise_equal(recompute.o, saved.o)) << "mode " << mode;
    EXPECT_TRUE(bitwise_equal(recompute.ht, saved.ht)) << "mode " << mode;
    Grads const& b = saved.grads;
    EXPECT_TRUE(bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) && bitwise_equal(a.dv, b.dv))
        << "dq, dk, dv differ between mode " << mode << " and recompute mode";
    EXPECT_TRUE(bitwise_equal(a.dg, b.dg) && bitwise_equal(a.dbeta, b.dbeta) &&
                bitwise_equal(a.dh0, b.dh0))
        << "dg, dbeta, dh0 differ between mode " << mode << " and recompute mode";
  }

  std::vector<double> ro(pr.BT * pr.HV * K), rht(pr.states_size()), rq(pr.BT * pr.H * K),
      rk(rq.size()), rv(ro.size()), rg(pr.BT * pr.HV * (kda ? K : 1)), rbeta(pr.BT * pr.HV),
      rh0(rht.size());
  cake::ref::Shape shape = pr.shape();
  if (kda) shape.gate = cake::ref::Gate::kChannel;
  std::vector<double> q = pr.q, k = pr.k, q_rstd, k_rstd;
  if (l2) {
    cake::ref::l2norm_forward(pr.q, K, q, q_rstd);
    cake::ref::l2norm_forward(pr.k, K, k, k_rstd);
  }
  cake::ref::Inputs const in{
      q.data(),       k.data(),     pr.v.data(), kda ? gate.g.data() : pr.g.data(),
      pr.beta.data(), pr.h0.data(), pr.scale};
  cake::ref::chunked_forward(shape, in, cake::ref::Outputs{ro.data(), rht.data()});
  cake::ref::chunked_backward(
      shape, in, cake::ref::OutputGrads{pr.dout.data(), pr.dht.data()},
      cake::ref::InputGrads{rq.data(), rk.data(), rv.data(), rg.data(), rbeta.data(), rh0.data()});
  if (l2) {
    rq = cake::ref::l2norm_backward(rq, q, q_rstd, K);
    rk = cake::ref::l2norm_backward(rk, k, k_rstd, K);
  }
  std::vector<std::pair<char const*, Errors>> errors(8);
  errors[0] = {"o", {}};
  errors[0].second.add(widen(recompute.o), ro);
  errors[1] = {"ht", {}};
  errors[1].second.add(recompute.ht, rht);
  errors[2] = {"dq", {}};
  errors[2].second.add(widen(a.dq), rq);
  errors[3] = {"dk", {}};
  errors[3].second.add(widen(a.dk), rk);
  errors[4] = {"dv", {}};
  errors[4].second.add(widen(a.dv), rv);
  errors[5] = {"dg", {}};
  errors[5].second.add(a.dg, rg);
  errors[6] = {"dbeta", {}};
  errors[6].second.add(a.dbeta, rbeta);
  errors[7] = {"dh0", {}};
  errors[7].second.add(a.dh0, rh0);
  for (auto const& [name, e] : errors) {
    std::printf(" %s %.1e/%.1e", name, e.rel_rms(), e.max_rel());
    // one draw: the gate with room for dg's single-draw tail (test_emu_gdn.cpp pools draws)
    EXPECT_TRUE(e.finite && e.rel_rms() <= 2e-2 && e.max_rel() <= 4e-2) << name;
  }
  std::printf("\n");
}

TEST(EmulatedOp, EveryModeMatchesTheFp64ReferenceAndEachOtherBitwise) {
  check_modes(Case{"docs 1,64,65,70 GVA 1/2", {1, 64, 65, 70}}, false);
}

// Documents of no tokens: their walks have no chunks, yet each h-walk still sets its flag (the
// reverse walks wait on them) and dh0 = dht, the final state h0.
TEST(EmulatedOp, EmptyDocumentsMatchTheFp64Reference) {
  check_modes(Case{"docs 0,65,0,1 GVA 1/2", {0, 65, 0, 1}}, false);
}

// With the L2 norm the forward's q̂, k̂ stay in its workspace except in saved mode, so the
// recompute and inverse backwards rerun qk_norm into theirs.
TEST(EmulatedOp, L2NormEveryModeMatchesTheFp64ReferenceAndEachOtherBitwise) {
  check_modes(Case{"docs 1,64,65,70 GVA 1/2 l2", {1, 64, 65, 70}}, true);
}

// A gradient left absent changes no other bit: the backward's arithmetic does not depend on which
// gradients are wanted (the H200 test test_absent_gradients caught dv moving with dh0 once, when
// walk_a_bwd keyed eO's hi + lo split on dh0), and nothing is written where one is absent.
TEST(EmulatedOp, KdaEveryModeMatchesTheFp64ReferenceAndEachOtherBitwise) {
  check_modes(Case{"docs 1,64,65,70 GVA 1/2", {1, 64, 65, 70}}, false, true);
}

TEST(EmulatedOp, KdaEmptyDocumentsAndL2NormMatchTheFp64Reference) {
  check_modes(Case{"docs 0,65,0,17 GVA 2/4 l2", {0, 65, 0, 17}, 2, 4}, true, true);
}

TEST(EmulatedOp, AbsentGradientsLeaveTheOthersBitwise) {
  Problem const pr = fresh_problem(Case{"docs 1,64,65 GVA 1/2", {1, 64, 65}});
  OpRun const full = run_op(pr, 0);
  OpRun const part = run_op(pr, 0, false);
  EXPECT_TRUE(bitwise_equal(full.grads.dv, part.grads.dv)) << "dv moved with dq, dk, dh0 absent";
  EXPECT_TRUE(bitwise_equal(full.grads.dg, part.grads.dg)) << "dg moved with dq, dk, dh0 absent";
  EXPECT_TRUE(bitwise_equal(full.grads.dbeta, part.grads.dbeta))
      << "dbeta moved with dq, dk, dh0 absent";
  EXPECT_TRUE(bitwise_equal(part.grads.dq, poisoned<bf16>(part.grads.dq.size())) &&
              bitwise_equal(part.grads.dk, poisoned<bf16>(part.grads.dk.size())) &&
              bitwise_equal(part.grads.dh0, poisoned<float>(part.grads.dh0.size())))
      << "an absent gradient's buffer was written";
}

// Documents do not see each other: Inf in one document's q, k, v and dO (a diverged sequence in
// a pack) leaves every output and gradient of the others bitwise as they were. The tiles of a
// document's last chunk hold the next document's rows unless a stage zeroes them (TMA copies
// whole boxes), and 0 x Inf is NaN.
TEST(EmulatedOp, DocumentsAreIsolated) {
  Problem const pr = fresh_problem(Case{"docs 65,70,30 GVA 1/2", {65, 70, 30}});
  Problem bad = pr;
  uint16_t const inf_bits = 0x7f80;
  bf16 inf;
  std::memcpy(&inf, &inf_bits, 2);
  // document 1's rows of a [BT, heads, K] tensor
  auto const fill_doc1 = [&](std::vector<bf16>& x, int heads) {
    std::fill(x.begin() + pr.cu[1] * heads * K, x.begin() + pr.cu[2] * heads * K, inf);
  };
  fill_doc1(bad.q16, pr.H);
  fill_doc1(bad.k16, pr.H);
  fill_doc1(bad.v16, pr.HV);
  fill_doc1(bad.dout16, pr.HV);
  for (int mode : {0, 2}) {
    OpRun const clean = run_op(pr, mode, true, true);
    OpRun const dirty = run_op(bad, mode, true, true);
    // Rows of documents 0 and 2 (tokens [0, cu1) and [cu2, BT)), per token of width w.
    auto const same_rows = [&](auto const& x, auto const& y, int64_t w) {
      bool same = std::memcmp(x.data(), y.data(), pr.cu[1] * w * sizeof(x[0])) == 0;
      int64_t const from = pr.cu[2] * w;
      return same &&
             std::memcmp(x.data() + from, y.data() + from, (x.size() - from) * sizeof(x[0])) == 0;
    };
    int64_t const state = int64_t{pr.HV} * K * K;  // per document
    auto const same_states = [&](std::vector<float> const& x, std::vector<float> const& y) {
      return std::memcmp(x.data(), y.data(), state * sizeof(float)) == 0 &&
             std::memcmp(x.data() + 2 * state, y.data() + 2 * state, state * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same_rows(clean.o, dirty.o, pr.HV * K)) << "o, mode " << mode;
    EXPECT_TRUE(same_states(clean.ht, dirty.ht)) << "ht, mode " << mode;
    Grads const& a = clean.grads;
    Grads const& b = dirty.grads;
    EXPECT_TRUE(same_rows(a.dq, b.dq, pr.H * K) && same_rows(a.dk, b.dk, pr.H * K) &&
                same_rows(a.dv, b.dv, pr.HV * K))
        << "dq, dk, dv, mode " << mode;
    EXPECT_TRUE(same_rows(a.dg, b.dg, pr.HV) && same_rows(a.dbeta, b.dbeta, pr.HV) &&
                same_states(a.dh0, b.dh0))
        << "dg, dbeta, dh0, mode " << mode;
  }
}

}  // namespace
