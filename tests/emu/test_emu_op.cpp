// The GDN and KDA GPU ops (src/ops/cuda/gdn_cuda.cpp, kda_cuda.cpp: the stages in order, the
// saved set and workspace carved from the caller's buffers), through the entry points the
// dispatch table calls (activations.cpp: with the in-op gate and beta sigmoid where asked), on
// the CPU emulator, against the FP64
// chunked reference: the three modes of the saved set, bitwise equal to each other; guard bytes
// after the exact workspace and saved set the size queries ask for stay untouched; outputs
// poisoned first. KDA's gate per channel is drawn as logsigmoid(N(0, 1)), one value in 16 down
// to -20 (kda_emu_testing.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor.hpp"
#include "emu/kda_emu_testing.hpp"
#include "emu/runtime.hpp"
#include "ops/activations_cuda.hpp"
#include "ops/cuda/gdn_workspace.hpp"
#include "ops/cuda/kda_workspace.hpp"
#include "ops/cuda/stages.hpp"
#include "ref/logistic.hpp"
#include "ref/preprocess.hpp"

namespace {

using bf16 = __nv_bfloat16;
using cake::emu_testing::Errors;
using cake::emu_testing::errors;
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

// bytes + kGuard, 256-byte aligned at the start (the saved set's rule), the bytes poisoned and the
// guard bytes filled.
struct Guarded {
  std::vector<unsigned char> raw;
  unsigned char* data = nullptr;
  size_t bytes = 0;
  explicit Guarded(size_t n) : raw(n + kGuard + 256), bytes(n) {
    auto const addr = reinterpret_cast<uintptr_t>(raw.data());
    data = raw.data() + (256 - addr % 256) % 256;
    std::memset(data, 0xff, n);  // poison (NaN as floats, -1 as ints): nothing may rely on zeros
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

// The in-op activations of a call (use_gate_in_kernel, use_beta_sigmoid_in_kernel with
// allow_neg_eigval): the raw g [BT, HV, W] and beta [BT, HV] the op takes, A_log [HV] and dt_bias
// [HV W]; lower_bound (< 0) picks the bounded form. All float32.
struct Activations {
  std::vector<float> g_raw, beta_raw, A_log, dt_bias;
  double lower_bound = 0;
};

// Forward then backward through the op in one mode; o, ht and the gradients.
struct OpRun {
  std::vector<bf16> o;
  std::vector<float> ht;
  Grads grads;
  std::vector<float> dA_log, ddt_bias;  // with activations
};

// mode: options.save_for_backward (0 recompute, 1 saved, 2 inverse); all_grads = false: dq, dk
// and dh0 absent (as a caller that freezes q, k and the initial state); l2: with the q/k L2 norm;
// gate: KDA's (else GDN); act: the op activates g and beta from act's raw inputs (in place of the
// problem's and the gate's); nan_qk_in_backward: the backward gets as q and k one NaN expanded to
// their shape (stride 0, as the Python autograd's stand-ins), the forward the real ones;
// unordered_sums: options.unordered_sums.
OpRun run_op(Problem const& pr, int mode, bool all_grads = true, bool l2 = false,
             ChannelGate const& gate = {}, Activations const* act = nullptr,
             bool nan_qk_in_backward = false, bool unordered_sums = false) {
  namespace op = cake::ops;
  int64_t const BT = pr.BT;
  int64_t const gate_width = gate.kda ? K : 1;
  cakeOptions_t options{};
  options.struct_size = sizeof options;
  options.variant = gate.kda ? cakeKda : cakeGdn;
  options.scale = pr.scale;
  options.save_for_backward = mode;
  options.use_qk_l2norm = l2 ? 1 : 0;
  options.unordered_sums = unordered_sums ? 1 : 0;
  cakeTensor_t const q = view(pr.q16.data(), cakeBfloat16, {1, BT, pr.H, K});
  cakeTensor_t const k = view(pr.k16.data(), cakeBfloat16, {1, BT, pr.H, K});
  cakeTensor_t const v = view(pr.v16.data(), cakeBfloat16, {1, BT, pr.HV, K});
  std::vector<int64_t> const g_shape =
      gate.kda ? std::vector<int64_t>{1, BT, pr.HV, K} : std::vector<int64_t>{1, BT, pr.HV};
  float const* g_data = act != nullptr ? act->g_raw.data()
                        : gate.kda     ? gate.g32.data()
                                       : pr.g32.data();
  cakeTensor_t const g = view(g_data, cakeFloat32, g_shape);
  cakeTensor_t const beta =
      view(act != nullptr ? act->beta_raw.data() : pr.beta32.data(), cakeFloat32, {1, BT, pr.HV});
  cakeTensor_t A_log{}, dt_bias{};
  if (act != nullptr) {
    options.use_gate_in_kernel = 1;
    options.has_lower_bound = act->lower_bound < 0 ? 1 : 0;
    options.lower_bound = act->lower_bound;
    options.use_beta_sigmoid = 1;
    options.allow_neg_eigval = 1;
    A_log = view(act->A_log.data(), cakeFloat32, {pr.HV});
    dt_bias = view(act->dt_bias.data(), cakeFloat32, {pr.HV * gate_width});
  }
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
    args.A_log = A_log;
    args.dt_bias = dt_bias;
  };
  cakeForwardArgs_t fa{};
  set_inputs(fa);
  fa.o = view(run.o.data(), cakeBfloat16, {1, BT, pr.HV, K});
  fa.final_state = view(run.ht.data(), cakeFloat32, {pr.N, pr.HV, K, K});
  Guarded saved(op::cuda_saved_bytes(options, q, v, cu));
  Guarded fws(op::cuda_forward_workspace_bytes(options, fa));
  op::cuda_forward(options, fa, saved.bytes != 0 ? saved.data : nullptr, fws.data, fws.bytes,
                   nullptr);
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
  bf16 nan;
  if (nan_qk_in_backward) {
    uint16_t const nan_bits = 0x7fc0;
    std::memcpy(&nan, &nan_bits, 2);
    ba.q = ba.k = view(&nan, cakeBfloat16, {1, BT, pr.H, K});
    std::fill(ba.q.strides, ba.q.strides + 4, 0);
    ba.k = ba.q;
  }
  ba.dout = view(pr.dout16.data(), cakeBfloat16, {1, BT, pr.HV, K});
  ba.dht = view(pr.dht32.data(), cakeFloat32, {pr.N, pr.HV, K, K});
  ba.dq = view(gr.dq.data(), cakeBfloat16, {1, BT, pr.H, K});
  ba.dk = view(gr.dk.data(), cakeBfloat16, {1, BT, pr.H, K});
  ba.dv = view(gr.dv.data(), cakeBfloat16, {1, BT, pr.HV, K});
  ba.dg = view(gr.dg.data(), cakeFloat32, g_shape);
  ba.dbeta = view(gr.dbeta.data(), cakeFloat32, {1, BT, pr.HV});
  ba.dh0 = view(gr.dh0.data(), cakeFloat32, {pr.N, pr.HV, K, K});
  if (act != nullptr) {
    run.dA_log = poisoned<float>(pr.HV);
    run.ddt_bias = poisoned<float>(pr.HV * gate_width);
    ba.dA_log = view(run.dA_log.data(), cakeFloat32, {pr.HV});
    ba.ddt_bias = view(run.ddt_bias.data(), cakeFloat32, {pr.HV * gate_width});
  }
  if (!all_grads) ba.dq = ba.dk = ba.dh0 = cakeTensor_t{};
  Guarded bws(op::cuda_backward_workspace_bytes(options, ba));
  // The backward reads the saved set only (autograd may run it twice with the same set).
  std::vector<unsigned char> const saved_before(saved.data, saved.data + saved.bytes);
  op::cuda_backward(options, ba, saved.bytes != 0 ? saved.data : nullptr, bws.data, bws.bytes,
                    nullptr);
  EXPECT_TRUE(bws.guard_intact()) << "the backward wrote past its workspace";
  EXPECT_TRUE(saved.guard_intact()) << "the backward wrote past the saved set";
  EXPECT_TRUE(std::equal(saved_before.begin(), saved_before.end(), saved.data))
      << "the backward wrote into the saved set (mode " << mode << ")";
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

// The FP64 chunked reference's outputs and input gradients for the problem with g ([BT, HV, K]
// when kda, else [BT, HV]) and beta in place of its own, on q, k normalised in FP64 when l2 (with
// the norm's backward).
struct Reference {
  std::vector<double> o, ht, dq, dk, dv, dg, dbeta, dh0;
};
Reference reference(Problem const& pr, bool l2, bool kda, std::vector<double> const& g,
                    std::vector<double> const& beta) {
  Reference r;
  r.o.resize(pr.BT * pr.HV * K);
  r.ht.resize(pr.states_size());
  r.dq.resize(pr.BT * pr.H * K);
  r.dk.resize(r.dq.size());
  r.dv.resize(r.o.size());
  r.dg.resize(pr.BT * pr.HV * (kda ? K : 1));
  r.dbeta.resize(pr.BT * pr.HV);
  r.dh0.resize(r.ht.size());
  cake::ref::Shape shape = pr.shape();
  if (kda) shape.gate = cake::ref::Gate::kChannel;
  std::vector<double> q = pr.q, k = pr.k, q_rstd, k_rstd;
  if (l2) {
    cake::ref::l2norm_forward(pr.q, K, q, q_rstd);
    cake::ref::l2norm_forward(pr.k, K, k, k_rstd);
  }
  cake::ref::Inputs const in{q.data(),    k.data(),     pr.v.data(), g.data(),
                             beta.data(), pr.h0.data(), pr.scale};
  cake::ref::chunked_forward(shape, in, cake::ref::Outputs{r.o.data(), r.ht.data()});
  cake::ref::chunked_backward(shape, in, cake::ref::OutputGrads{pr.dout.data(), pr.dht.data()},
                              cake::ref::InputGrads{r.dq.data(), r.dk.data(), r.dv.data(),
                                                    r.dg.data(), r.dbeta.data(), r.dh0.data()});
  if (l2) {
    r.dq = cake::ref::l2norm_backward(r.dq, q, q_rstd, K);
    r.dk = cake::ref::l2norm_backward(r.dk, k, k_rstd, K);
  }
  return r;
}

// Prints each output's rel-RMS / max-abs over max|ref| and expects it within the gate.
void expect_within_gate(std::vector<std::pair<char const*, Errors>> const& outputs) {
  for (auto const& [name, e] : outputs) {
    std::printf(" %s %.1e/%.1e", name, e.rel_rms(), e.max_rel());
    // one draw: the gate with room for dg's single-draw tail (test_emu_gdn.cpp pools draws)
    EXPECT_TRUE(e.finite && e.rel_rms() <= 2e-2 && e.max_rel() <= 4e-2) << name;
  }
  std::printf("\n");
}

// The saved and inverse modes give recompute mode's results bit for bit.
void expect_other_modes_bitwise(OpRun const& recompute, Problem const& pr, bool l2,
                                ChannelGate const& gate, Activations const* act = nullptr) {
  Grads const& a = recompute.grads;
  for (int mode : {1, 2}) {
    OpRun const saved = run_op(pr, mode, true, l2, gate, act);
    EXPECT_TRUE(bitwise_equal(recompute.o, saved.o)) << "mode " << mode;
    EXPECT_TRUE(bitwise_equal(recompute.ht, saved.ht)) << "mode " << mode;
    Grads const& b = saved.grads;
    EXPECT_TRUE(bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) && bitwise_equal(a.dv, b.dv))
        << "dq, dk, dv differ between mode " << mode << " and recompute mode";
    EXPECT_TRUE(bitwise_equal(a.dg, b.dg) && bitwise_equal(a.dbeta, b.dbeta) &&
                bitwise_equal(a.dh0, b.dh0))
        << "dg, dbeta, dh0 differ between mode " << mode << " and recompute mode";
    EXPECT_TRUE(bitwise_equal(recompute.dA_log, saved.dA_log) &&
                bitwise_equal(recompute.ddt_bias, saved.ddt_bias))
        << "dA_log, ddt_bias differ between mode " << mode << " and recompute mode";
  }
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
  expect_other_modes_bitwise(recompute, pr, l2, gate);

  Reference const r = reference(pr, l2, kda, kda ? gate.g : pr.g, pr.beta);
  expect_within_gate({{"o", errors(widen(recompute.o), r.o)},
                      {"ht", errors(recompute.ht, r.ht)},
                      {"dq", errors(widen(a.dq), r.dq)},
                      {"dk", errors(widen(a.dk), r.dk)},
                      {"dv", errors(widen(a.dv), r.dv)},
                      {"dg", errors(a.dg, r.dg)},
                      {"dbeta", errors(a.dbeta, r.dbeta)},
                      {"dh0", errors(a.dh0, r.dh0)}});
}

TEST(EmulatedOp, EveryModeMatchesTheFp64ReferenceAndEachOtherBitwise) {
  check_modes(Case{"docs 1,64,65,70 GVA 1/2", {1, 64, 65, 70}}, false);
}

// options.unordered_sums: GDN's dq and dk, summed over the value heads by adds in any order (into
// sums the op zeroes), pass the gate in every mode and both forms of the reverse walk (the split,
// which these problems' few walks pick on the emulated 132 SMs, and the walk, on one SM); the
// other gradients are bitwise those of the ordered sum (only dq and dk go through it). Group
// sizes 2 and 1 (with one value head per q/k head there is no sum: the terms are stored).
TEST(EmulatedOp, UnorderedSumsMatchTheFp64Reference) {
  for (Case const& c : {Case{"docs 1,64,65,70 GVA 1/2", {1, 64, 65, 70}},
                        Case{"docs 63,130 GVA 2/2", {63, 130}, 2, 2}}) {
    Problem const pr = fresh_problem(c);
    Reference const r = reference(pr, false, false, pr.g, pr.beta);
    OpRun const ordered = run_op(pr, 0);
    for (int const sms : {132, 1})
      for (int mode : {0, 1, 2}) {
        OpRun const run = [&] {
          cake::emu::ScopedMultiprocessorCount const count(sms);
          return run_op(pr, mode, true, false, {}, nullptr, false, true);
        }();
        Grads const& a = run.grads;
        SCOPED_TRACE(c.name + std::string(", mode ") + std::to_string(mode) +
                     (sms == 1 ? ", walk" : ", split"));
        expect_within_gate(
            {{"dq", errors(widen(a.dq), r.dq)}, {"dk", errors(widen(a.dk), r.dk)}});
        EXPECT_TRUE(bitwise_equal(ordered.o, run.o) && bitwise_equal(ordered.grads.dv, a.dv) &&
                    bitwise_equal(ordered.grads.dg, a.dg) &&
                    bitwise_equal(ordered.grads.dbeta, a.dbeta) &&
                    bitwise_equal(ordered.grads.dh0, a.dh0));
      }
  }
}

// Documents of no tokens: their walks have no chunks, yet each h-walk still sets its flag (the
// reverse walks wait on them) and dh0 = dht, the final state h0. The document of 200 tokens keeps
// the one-token document's dg (a sum over the whole state, ~7x the others, with a few % of error
// in one draw of ~50 from its cancellations) from being most of the pack's dg.
TEST(EmulatedOp, EmptyDocumentsMatchTheFp64Reference) {
  check_modes(Case{"docs 0,65,0,1,200 GVA 1/2", {0, 65, 0, 1, 200}}, false);
}

// Documents of no token (T = 0, N = 2): no stage runs (the driver refuses a TMA map of zero
// tokens, and the emulator now does too), each final state is its initial state and each dh0 its
// dht, bitwise, in every mode, GDN and KDA.
TEST(EmulatedOp, NoTokensPassTheStatesThrough) {
  Problem const pr = fresh_problem(Case{"docs 0,0 GVA 1/2", {0, 0}});
  for (bool kda : {false, true}) {
    ChannelGate gate;
    gate.kda = kda;
    for (int mode : {0, 1, 2}) {
      OpRun const run = run_op(pr, mode, true, false, gate);
      EXPECT_TRUE(bitwise_equal(run.ht, pr.h0_32)) << "ht, kda " << kda << ", mode " << mode;
      EXPECT_TRUE(bitwise_equal(run.grads.dh0, pr.dht32))
          << "dh0, kda " << kda << ", mode " << mode;
    }
  }
}

// With the L2 norm the forward's q̂, k̂ and rstd stay in its workspace in recompute mode, whose
// backward reruns qk_norm into its own; saved and inverse modes keep them in the saved set.
TEST(EmulatedOp, L2NormEveryModeMatchesTheFp64ReferenceAndEachOtherBitwise) {
  check_modes(Case{"docs 1,64,65,70 GVA 1/2 l2", {1, 64, 65, 70}}, true);
}

// With the L2 norm, GDN's saved and inverse backwards read q̂, k̂ and rstd from the saved set and
// no element of q or k (include/cake/cake.h: a caller need not keep them): NaN there changes no
// bit.
TEST(EmulatedOp, L2NormSavedSetsReadNoQk) {
  Problem const pr = fresh_problem(Case{"docs 1,64,65 GVA 1/2 l2", {1, 64, 65}});
  for (int mode : {1, 2}) {
    OpRun const real = run_op(pr, mode, true, true);
    OpRun const nan = run_op(pr, mode, true, true, {}, nullptr, true);
    Grads const& a = real.grads;
    Grads const& b = nan.grads;
    EXPECT_TRUE(bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) &&
                bitwise_equal(a.dv, b.dv) && bitwise_equal(a.dg, b.dg) &&
                bitwise_equal(a.dbeta, b.dbeta) && bitwise_equal(a.dh0, b.dh0))
        << "mode " << mode << ": the backward read q or k";
  }
}

TEST(EmulatedOp, KdaEveryModeMatchesTheFp64ReferenceAndEachOtherBitwise) {
  check_modes(Case{"docs 1,64,65,70 GVA 1/2", {1, 64, 65, 70}}, false, true);
}

TEST(EmulatedOp, KdaEmptyDocumentsAndL2NormMatchTheFp64Reference) {
  check_modes(Case{"docs 0,65,0,17 GVA 2/4 l2", {0, 65, 0, 17}, 2, 4}, true, true);
}

// KDA with the L2 norm and grouped value heads on short documents: dq, dk summed over three value
// heads a q/k head and finished per row (the norm's backward) where a chunk has one row or its
// row groups run past its end (documents of 1, 63, 64 and 65 tokens).
TEST(EmulatedOp, KdaL2NormGroupedHeadsShortDocumentsMatchTheFp64Reference) {
  check_modes(Case{"docs 1,63,64,65 GVA 2/6 l2", {1, 63, 64, 65}, 2, 6}, true, true);
}

// The backward's two forms of the reverse walk (ops/cuda/stages.hpp, reverse_form), picked by the
// device's SM count: the split where the walks are fewer (the other tests' problems, on the
// emulated 132), the walk where they are not (one SM); the same gradients bit for bit (GDN's dq
// and dk summed over groups of 2 and 4 value heads in the same order by both), in the recompute
// mode (the dS-walk beside the h-walk) and the saved mode, with and without states, GDN and KDA,
// and each form's workspace exactly as its size query asked (run_op's guard bytes).
TEST(EmulatedOp, ReverseWalkFormsAgreeBitwise) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (bool const kda : {false, true})
    for (Case const& c :
         {Case{"docs 1,64,65,200 GVA 1/2", {1, 64, 65, 200}},
          Case{"docs 63,130 GVA 1/4 no states", {63, 130}, 1, 4, -1.f, 0.f, 0.f, 1.f, false}}) {
      Problem const pr = cake::gdn_testing::make_problem(c, rng);
      ChannelGate const gate = kda ? channel_gate(pr, rng) : ChannelGate{};
      for (int mode : {0, 1}) {
        OpRun const split = run_op(pr, mode, true, false, gate);
        OpRun const walk = [&] {
          cake::emu::ScopedMultiprocessorCount const count(1);
          return run_op(pr, mode, true, false, gate);
        }();
        Grads const& a = split.grads;
        Grads const& b = walk.grads;
        EXPECT_TRUE(bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) &&
                    bitwise_equal(a.dv, b.dv))
            << c.name << ", kda " << kda << ": dq, dk, dv differ between the forms in mode "
            << mode;
        EXPECT_TRUE(bitwise_equal(a.dg, b.dg) && bitwise_equal(a.dbeta, b.dbeta) &&
                    bitwise_equal(a.dh0, b.dh0))
            << c.name << ", kda " << kda << ": dg, dbeta, dh0 differ between the forms in mode "
            << mode;
      }
    }
}

// The split's dS buffer is held to kSplitDsBytes (8 GiB): one document at 16 value heads (16
// walks, fewer than the emulated 132 SMs) splits up to 8,192 slots (~512K tokens) and walks past
// them, a 1M-token document among them; many walks walk at any size. The buffer is what the
// split adds to GDN's and KDA's backward workspaces.
TEST(EmulatedOp, SplitDsBufferIsHeldToItsBudget) {
  using cake::ops::cuda::ReverseForm;
  auto const problem = [](int64_t tokens, int32_t docs, int32_t v_heads) {
    cake::kernels::Problem p;
    p.num_tokens = tokens;
    p.seq_len = tokens / docs;
    p.num_seqs = docs;
    p.num_qk_heads = v_heads;
    p.num_v_heads = v_heads;
    p.num_slots = cake::kernels::slots_for(tokens, docs);
    return p;
  };
  auto const form = [](cake::kernels::Problem const& p) {
    return cake::ops::cuda::reverse_form(p, 0);
  };
  cake::kernels::Problem const at_budget = problem(64 * (8192 - 2), 1, 16);
  ASSERT_EQ(at_budget.num_slots, 8192);
  EXPECT_EQ(cake::ops::cuda::split_ds_bytes(at_budget), cake::ops::cuda::kSplitDsBytes);
  EXPECT_EQ(form(at_budget), ReverseForm::kSplit);
  EXPECT_EQ(form(problem(64 * (8192 - 1), 1, 16)), ReverseForm::kWalk);
  EXPECT_EQ(form(problem(int64_t{1} << 20, 1, 16)), ReverseForm::kWalk);
  EXPECT_EQ(form(problem(int64_t{1} << 16, 4, 16)), ReverseForm::kSplit);
  EXPECT_EQ(form(problem(int64_t{1} << 16, 9, 16)), ReverseForm::kWalk);  // 144 walks

  using cake::ops::cuda::Pass;
  using cake::ops::cuda::SaveMode;
  for (SaveMode const mode : {SaveMode::kRecompute, SaveMode::kSaved, SaveMode::kInverse}) {
    auto const gdn = [&](bool split) {
      return cake::ops::cuda::carve_gdn_buffers(at_budget, false, Pass::kBackward, mode, split,
                                                nullptr, nullptr)
          .workspace_bytes;
    };
    auto const kda = [&](bool split) {
      return cake::ops::cuda::carve_kda_buffers(at_budget, false, Pass::kBackward, mode, split,
                                                nullptr, nullptr)
          .workspace_bytes;
    };
    // The buffer, after at most one region's alignment (kAlign) ahead of it.
    size_t const ds = cake::ops::cuda::kSplitDsBytes;
    size_t const align = cake::ops::cuda::kAlign;
    EXPECT_GE(gdn(true) - gdn(false), ds);
    EXPECT_LT(gdn(true) - gdn(false), ds + align);
    EXPECT_GE(kda(true) - kda(false), ds);
    EXPECT_LT(kda(true) - kda(false), ds + align);
  }
}

// A gradient left absent changes no other bit: the backward's arithmetic does not depend on which
// gradients are wanted (the H200 test test_absent_gradients caught dv moving with dh0 once, when
// walk_a_bwd keyed eO's hi + lo split on dh0), and nothing is written where one is absent.
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

// The in-op activations on the GPU path (src/kernels/gate around the op): the raw gate through
// -exp(A_log) softplus(g + dt_bias) or lower_bound sigmoid(exp(A_log) (g + dt_bias)), beta through
// 2 sigmoid(beta) (allow_neg_eigval); every mode bitwise equal, and o, the state and every
// gradient within the gate against the FP64 reference of the activations and the delta rule
// (ddt_bias's and dA_log's errors against their terms' magnitudes). Raw inputs: g ~ N(0, 1),
// A_log ~ U(-1, 1), dt_bias ~ N(0, 0.5), beta ~ N(0, 1.5).
void check_activations(Case const& c, bool kda, double lower_bound) {
  unsigned const seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Problem const pr = cake::gdn_testing::make_problem(c, rng);
  int64_t const width = kda ? K : 1;
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  Activations act;
  act.lower_bound = lower_bound;
  for (int64_t i = 0; i < pr.BT * pr.HV * width; ++i) act.g_raw.push_back(normal(rng));
  for (int64_t i = 0; i < pr.BT * pr.HV; ++i) act.beta_raw.push_back(1.5f * normal(rng));
  for (int i = 0; i < pr.HV; ++i) act.A_log.push_back(uniform(rng));
  for (int64_t i = 0; i < pr.HV * width; ++i) act.dt_bias.push_back(0.5f * normal(rng));
  ChannelGate gate;
  gate.kda = kda;
  OpRun const recompute = run_op(pr, 0, true, false, gate, &act);
  expect_other_modes_bitwise(recompute, pr, false, gate, &act);

  auto const wide = [](std::vector<float> const& x) {
    return std::vector<double>(x.begin(), x.end());
  };
  cake::ref::GateParams gp;
  gp.num_v_heads = pr.HV;
  gp.width = width;
  gp.A_log = wide(act.A_log);
  gp.dt_bias = wide(act.dt_bias);
  if (lower_bound < 0) gp.lower_bound = lower_bound;
  std::vector<double> const g = cake::ref::gate_forward(gp, wide(act.g_raw));
  std::vector<double> const beta = cake::ref::beta_sigmoid_forward(wide(act.beta_raw), 2.0);
  Reference const r = reference(pr, false, kda, g, beta);
  cake::ref::GateGrads const gg = cake::ref::gate_backward(gp, wide(act.g_raw), r.dg);
  std::vector<double> const dbeta =
      cake::ref::beta_sigmoid_backward(wide(act.beta_raw), 2.0, r.dbeta);
  Grads const& a = recompute.grads;
  expect_within_gate({{"o", errors(widen(recompute.o), r.o)},
                      {"ht", errors(recompute.ht, r.ht)},
                      {"dq", errors(widen(a.dq), r.dq)},
                      {"dk", errors(widen(a.dk), r.dk)},
                      {"dv", errors(widen(a.dv), r.dv)},
                      {"dg", errors(a.dg, gg.dg_raw)},
                      {"dbeta", errors(a.dbeta, dbeta)},
                      {"dh0", errors(a.dh0, r.dh0)}});
  // ddt_bias sums BT terms of both signs per slot (dg_raw's), each carrying dg's error: its
  // error is held to the gate against the sums of the terms' magnitudes (rel-RMS and max over
  // them) rather than against the sums themselves, where a draw whose terms nearly cancel fails a
  // correct op (GDN has one slot per value head: rare draws did).
  int64_t const slots = pr.HV * width;
  std::vector<double> bias_magnitude(slots, 0.0);
  for (size_t e = 0; e < gg.dg_raw.size(); ++e) {
    bias_magnitude[static_cast<int64_t>(e) % slots] += std::abs(gg.dg_raw[e]);
  }
  double err2 = 0, mag2 = 0, err_max = 0, mag_max = 0;
  bool finite = true;
  for (int64_t j = 0; j < slots; ++j) {
    double const err = std::abs(recompute.ddt_bias[j] - gg.ddt_bias[j]);
    finite = finite && std::isfinite(recompute.ddt_bias[j]);
    err2 += err * err;
    mag2 += bias_magnitude[j] * bias_magnitude[j];
    err_max = std::max(err_max, err);
    mag_max = std::max(mag_max, bias_magnitude[j]);
  }
  double const bias_rms = std::sqrt(err2 / mag2), bias_max = err_max / mag_max;
  std::printf(" ddt_bias %.1e/%.1e of its terms' magnitudes\n", bias_rms, bias_max);
  EXPECT_TRUE(finite && bias_rms <= 2e-2 && bias_max <= 4e-2) << "ddt_bias";
  // dA_log sums BT W terms of both signs per value head: its error against the sum of the terms'
  // magnitudes, per value head.
  std::vector<double> magnitude(pr.HV, 0.0);
  for (size_t e = 0; e < g.size(); ++e) {
    int64_t const slot = static_cast<int64_t>(e) % slots, hv = slot / width;
    double const a = std::exp(gp.A_log[hv]), x = gp.dt_bias[slot] + act.g_raw[e];
    double const term = lower_bound < 0
                            ? r.dg[e] * lower_bound * cake::ref::sigmoid_slope(a * x) * a * x
                            : g[e] * r.dg[e];
    magnitude[hv] += std::abs(term);
  }
  for (int hv = 0; hv < pr.HV; ++hv) {
    double const err = std::abs(recompute.dA_log[hv] - gg.dA_log[hv]) / magnitude[hv];
    EXPECT_TRUE(std::isfinite(recompute.dA_log[hv]) && err <= 1e-2)
        << "dA_log[" << hv << "]: error " << err << " of its terms' magnitude";
  }
}

TEST(EmulatedOp, GdnInOpGateAndBetaSigmoidMatchTheFp64Reference) {
  check_activations(Case{"docs 1,64,65,300 GVA 1/2", {1, 64, 65, 300}}, false, 0);
}

TEST(EmulatedOp, KdaInOpGateAndBetaSigmoidMatchTheFp64Reference) {
  check_activations(Case{"docs 1,64,65,70 GVA 1/2", {1, 64, 65, 70}}, true, 0);
}

TEST(EmulatedOp, KdaInOpLowerBoundGateMatchesTheFp64Reference) {
  check_activations(Case{"docs 0,65,17 GVA 2/4", {0, 65, 17}, 2, 4}, true, -5);
}

}  // namespace
