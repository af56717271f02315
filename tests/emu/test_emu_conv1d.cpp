// The conv's GPU op (src/ops/cuda/conv1d_cuda.cpp and the kernels of conv1d_fwd, conv1d_bwd) on the
// CPU emulator, through the C ABI on "CUDA" tensors in host memory, against the FP64 reference
// (ref/conv1d.hpp) on the same rounded inputs: bfloat16, float16 and float32 x; widths 2..4; D
// with and without vector loads, over one and several channel blocks; packs of documents of 0..5,
// W - 1, W, W + 1 tokens and ones across tiles; states, bias, residual, SiLU, each also off;
// the input ring's edges (D from 1 to 2048, aligned and misaligned bases). Outputs poisoned
// first; guard bytes after the exact workspace stay untouched; the backward twice is bitwise
// equal (fixed-order reductions).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/tensor.hpp"
#include "emu/gdn_emu_testing.hpp"
#include "ref/conv1d.hpp"

namespace {

using cake::emu_testing::cuda_view;
using cake::emu_testing::Errors;
using cake::emu_testing::poisoned;
using cake::emu_testing::random_values;
using cake::emu_testing::widen;

struct Case {
  std::vector<int64_t> lengths;
  int64_t dim;
  int width;
};

// The optional tensors of a case: bias, residual, states (initial and final, and their
// gradients); `shift` elements of offset on x, dy and the residual (bases off 16 bytes: the
// kernels' rows then come without bulk copies).
struct Options {
  bool bias = true, residual = true, states = true;
  int shift = 0;
};

template <class T>
void check_case(Case const& c, uint64_t seed, Options const& o = {}) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  int64_t const D = c.dim, W = c.width;
  std::vector<int64_t> cu = {0};
  for (int64_t n : c.lengths) cu.push_back(cu.back() + n);
  int64_t const T_ = cu.back(), N = static_cast<int64_t>(c.lengths.size());
  std::vector<T> const x_buf = random_values<T>(T_ * D + o.shift, rng),
                       residual_buf = random_values<T>(T_ * D + o.shift, rng);
  std::vector<T> const h0 = random_values<T>(N * D * W, rng),
                       dy_buf = random_values<T>(T_ * D + o.shift, rng);
  T const* const x = x_buf.data() + o.shift;
  T const* const residual = residual_buf.data() + o.shift;
  T const* const dy = dy_buf.data() + o.shift;
  std::vector<T> const dht = random_values<T>(N * D * W, rng);
  std::vector<float> const weight = random_values<float>(D * W, rng);
  std::vector<float> const bias = random_values<float>(D, rng);

  auto const span = [&](T const* p) { return std::vector<T>(p, p + T_ * D); };
  cake::ref::Conv1dShape shape{T_, D, W, cu};
  std::vector<double> const xd = widen(span(x)), rd = widen(span(residual)), hd = widen(h0),
                            wd = widen(weight), bd = widen(bias), dyd = widen(span(dy)),
                            dhtd = widen(dht);
  cake::ref::Conv1dInputs const in{xd.data(),
                                   wd.data(),
                                   o.bias ? bd.data() : nullptr,
                                   o.residual ? rd.data() : nullptr,
                                   o.states ? hd.data() : nullptr,
                                   cake::ref::Activation::kSilu};
  std::vector<double> y_ref(T_ * D), ht_ref(N * D * W), dx_ref(T_ * D), dw_ref(D * W), db_ref(D),
      dh0_ref(N * D * W);
  cake::ref::conv1d_forward(shape, in, {y_ref.data(), ht_ref.data()});
  cake::ref::conv1d_backward(
      shape, in, dyd.data(), o.states ? dhtd.data() : nullptr,
      {dx_ref.data(), dw_ref.data(), db_ref.data(), nullptr, dh0_ref.data()});

  std::vector<T> y = poisoned<T>(T_ * D), ht = poisoned<T>(N * D * W);
  cakeConv1dForwardArgs_t fa{};
  fa.struct_size = sizeof fa;
  fa.activation = cakeActivationSilu;
  fa.x = cuda_view(const_cast<T*>(x), {1, T_, D});
  fa.weight = cuda_view(weight.data(), {D, W});
  if (o.bias) fa.bias = cuda_view(bias.data(), {D});
  if (o.residual) fa.residual = cuda_view(const_cast<T*>(residual), {1, T_, D});
  if (o.states) fa.initial_state = cuda_view(h0.data(), {N, D, W});
  fa.cu_seqlens = cake::dense_view(cu.data(), cakeInt64, cakeCUDA, {N + 1});
  fa.y = cuda_view(y.data(), {1, T_, D});
  if (o.states) fa.final_state = cuda_view(ht.data(), {N, D, W});
  size_t fwd_bytes = 1;
  ASSERT_EQ(cakeConv1dForwardWorkspaceSize(&fa, &fwd_bytes), cakeSuccess) << cakeGetLastError();
  EXPECT_EQ(fwd_bytes, 0u);
  ASSERT_EQ(cakeConv1dForward(&fa, nullptr, 0, nullptr), cakeSuccess) << cakeGetLastError();

  auto backward = [&](std::vector<T>& dx, std::vector<T>& dres, std::vector<float>& dw,
                      std::vector<float>& db, std::vector<T>& dh0) {
    cakeConv1dBackwardArgs_t ba{};
    ba.struct_size = sizeof ba;
    ba.activation = cakeActivationSilu;
    ba.x = fa.x;
    ba.weight = fa.weight;
    ba.bias = fa.bias;
    ba.initial_state = fa.initial_state;
    ba.cu_seqlens = fa.cu_seqlens;
    ba.dy = cuda_view(const_cast<T*>(dy), {1, T_, D});
    if (o.states) ba.dht = cuda_view(dht.data(), {N, D, W});
    ba.dx = cuda_view(dx.data(), {1, T_, D});
    ba.dweight = cuda_view(dw.data(), {D, W});
    if (o.bias) ba.dbias = cuda_view(db.data(), {D});
    if (o.residual) ba.dresidual = cuda_view(dres.data(), {1, T_, D});
    if (o.states) ba.dinitial_state = cuda_view(dh0.data(), {N, D, W});
    size_t bytes = 0;
    ASSERT_EQ(cakeConv1dBackwardWorkspaceSize(&ba, &bytes), cakeSuccess) << cakeGetLastError();
    constexpr size_t kGuard = 1024;
    std::vector<unsigned char> ws(bytes + kGuard + 256, 0xff);
    auto* base = ws.data() + (256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256;
    std::memset(base + bytes, 0xa5, kGuard);
    ASSERT_EQ(cakeConv1dBackward(&ba, base, bytes, nullptr), cakeSuccess) << cakeGetLastError();
    for (size_t i = 0; i < kGuard; ++i) ASSERT_EQ(base[bytes + i], 0xa5) << "guard byte " << i;
  };
  std::vector<T> dx = poisoned<T>(T_ * D), dres = poisoned<T>(T_ * D), dh0 = poisoned<T>(N * D * W);
  std::vector<float> dw = poisoned<float>(D * W), db = poisoned<float>(D);
  backward(dx, dres, dw, db, dh0);

  bool const fp32 = std::is_same_v<T, float>;
  auto gate = [&](char const* name, auto const& got, std::vector<double> const& ref) {
    Errors e;
    e.add(widen(got), ref);
    SCOPED_TRACE(std::string(name) + ", W = " + std::to_string(W) + ", D = " + std::to_string(D));
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.rel_rms(), fp32 ? 1e-5 : 1e-2);
    EXPECT_LE(e.max_rel(), fp32 ? 1e-5 : 2e-2);
  };
  gate("y", y, y_ref);
  gate("dx", dx, dx_ref);
  gate("dweight", dw, dw_ref);
  if (o.states) {
    gate("final_state", ht, ht_ref);
    gate("dinitial_state", dh0, dh0_ref);
  }
  if (o.bias) gate("dbias", db, db_ref);
  if (o.residual) {
    EXPECT_EQ(std::memcmp(dres.data(), dy, T_ * D * sizeof(T)), 0) << "dresidual = dy";
  }

  std::vector<T> dx2 = poisoned<T>(T_ * D), dres2 = poisoned<T>(T_ * D),
                 dh02 = poisoned<T>(N * D * W);
  std::vector<float> dw2 = poisoned<float>(D * W), db2 = poisoned<float>(D);
  backward(dx2, dres2, dw2, db2, dh02);
  EXPECT_EQ(std::memcmp(dx.data(), dx2.data(), dx.size() * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(dw.data(), dw2.data(), dw.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(db.data(), db2.data(), db.size() * sizeof(float)), 0);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int W = 2; W <= 4; ++W) {
    // 70 tokens cross the backward's 32-token tiles; 0 is an empty document.
    std::vector<int64_t> lengths = {1, 2, 3, 4, 5, W - 1, W, W + 1, 0, 70, 1};
    out.push_back({lengths, 16, W});  // whole vectors of 4 channels
    out.push_back({lengths, 13, W});  // element loads, channels past D
  }
  // 1,100 tokens make 35 tiles of 32: the reduction's warps each sum four tiles ahead, then
  // warps 0-2 one tile more
  out.push_back({{600, 500}, 16, 4});
  return out;
}

TEST(EmulatedConv1d, Bfloat16MatchesReference) {
  uint64_t seed = 1;
  for (Case const& c : cases()) check_case<__nv_bfloat16>(c, seed++);
}

TEST(EmulatedConv1d, Float16MatchesReference) {
  uint64_t seed = 100;
  for (Case const& c : cases()) check_case<__half>(c, seed++);
}

TEST(EmulatedConv1d, Float32MatchesReference) {
  uint64_t seed = 200;
  for (Case const& c : cases()) check_case<float>(c, seed++);
}

// Without bias, residual and states, no activation; B rows of T tokens (no cu_seqlens) or int32
// cu_seqlens; only dx and dweight wanted (no workspace for dbias).
template <class T>
void check_plain(bool packed, int64_t D, int W, uint64_t seed) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  int64_t const B = packed ? 1 : 3, rows = 37, BT = B * rows;
  std::vector<int32_t> const cu32 = {0, 1, 5, 5, 37};
  std::vector<int64_t> cu;
  if (packed) {
    cu.assign(cu32.begin(), cu32.end());
  } else {
    for (int64_t b = 0; b <= B; ++b) cu.push_back(b * rows);
  }
  int64_t const N = static_cast<int64_t>(cu.size()) - 1;
  std::vector<T> const x = random_values<T>(BT * D, rng), dy = random_values<T>(BT * D, rng);
  std::vector<float> const weight = random_values<float>(D * W, rng);
  cake::ref::Conv1dShape shape{BT, D, W, cu};
  std::vector<double> const xd = widen(x), wd = widen(weight), dyd = widen(dy);
  cake::ref::Conv1dInputs const in{xd.data(), wd.data(), nullptr,
                                   nullptr,   nullptr,   cake::ref::Activation::kNone};
  std::vector<double> y_ref(BT * D), ht_ref(N * D * W), dx_ref(BT * D), dw_ref(D * W);
  cake::ref::conv1d_forward(shape, in, {y_ref.data(), ht_ref.data()});
  cake::ref::conv1d_backward(shape, in, dyd.data(), nullptr,
                             {dx_ref.data(), dw_ref.data(), nullptr, nullptr, nullptr});

  std::vector<T> y = poisoned<T>(BT * D), ht = poisoned<T>(N * D * W), dx = poisoned<T>(BT * D);
  std::vector<float> dw = poisoned<float>(D * W);
  int64_t const T_ = packed ? BT : rows;
  cakeTensor_t const cu_view =
      packed ? cake::dense_view(const_cast<int32_t*>(cu32.data()), cakeInt32, cakeCUDA, {N + 1})
             : cakeTensor_t{};
  cakeConv1dForwardArgs_t fa{};
  fa.struct_size = sizeof fa;
  fa.x = cuda_view(x.data(), {B, T_, D});
  fa.weight = cuda_view(weight.data(), {D, W});
  fa.cu_seqlens = cu_view;
  fa.y = cuda_view(y.data(), {B, T_, D});
  fa.final_state = cuda_view(ht.data(), {N, D, W});
  ASSERT_EQ(cakeConv1dForward(&fa, nullptr, 0, nullptr), cakeSuccess) << cakeGetLastError();
  cakeConv1dBackwardArgs_t ba{};
  ba.struct_size = sizeof ba;
  ba.x = fa.x;
  ba.weight = fa.weight;
  ba.cu_seqlens = cu_view;
  ba.dy = cuda_view(dy.data(), {B, T_, D});
  ba.dx = cuda_view(dx.data(), {B, T_, D});
  ba.dweight = cuda_view(dw.data(), {D, W});
  size_t bytes = 0;
  ASSERT_EQ(cakeConv1dBackwardWorkspaceSize(&ba, &bytes), cakeSuccess) << cakeGetLastError();
  std::vector<unsigned char> ws(bytes + 256);
  auto* base = ws.data() + (256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256;
  ASSERT_EQ(cakeConv1dBackward(&ba, base, bytes, nullptr), cakeSuccess) << cakeGetLastError();
  bool const fp32 = std::is_same_v<T, float>;
  std::tuple<char const*, std::vector<double>, std::vector<double> const*> const outputs[] = {
      {"y", widen(y), &y_ref},
      {"final_state", widen(ht), &ht_ref},
      {"dx", widen(dx), &dx_ref},
      {"dweight", widen(dw), &dw_ref}};
  for (auto const& [name, got, ref] : outputs) {
    Errors e;
    e.add(got, *ref);
    SCOPED_TRACE(std::string(name) + (packed ? ", packed" : ", rows"));
    EXPECT_TRUE(e.finite);
    EXPECT_LE(e.rel_rms(), fp32 ? 1e-5 : 1e-2);
    EXPECT_LE(e.max_rel(), fp32 ? 1e-5 : 2e-2);
  }
}

TEST(EmulatedConv1d, RowsAndInt32OffsetsWithoutOptionalTensors) {
  uint64_t seed = 400;
  for (bool packed : {false, true}) {
    for (int W = 2; W <= 4; ++W) {
      check_plain<__nv_bfloat16>(packed, 12, W, seed++);
      check_plain<float>(packed, 7, W, seed++);
    }
  }
}

// No tokens (T = 0): the backward's workspace is 0 bytes, passed as NULL; dweight and dbias are
// still written, as zeros (element 0 too, whose partial sums' address is then NULL).
TEST(EmulatedConv1d, BackwardWithoutTokens) {
  int64_t const D = 16, W = 4;
  float x_dummy = 0.f;  // a present tensor of no elements
  std::vector<float> const weight(D * W, 1.f), bias(D, 1.f);
  std::vector<float> dw = poisoned<float>(D * W), db = poisoned<float>(D);
  cakeConv1dBackwardArgs_t ba{};
  ba.struct_size = sizeof ba;
  ba.activation = cakeActivationSilu;
  ba.x = cuda_view(&x_dummy, {1, 0, D});
  ba.weight = cuda_view(weight.data(), {D, W});
  ba.bias = cuda_view(bias.data(), {D});
  ba.dy = cuda_view(&x_dummy, {1, 0, D});
  ba.dweight = cuda_view(dw.data(), {D, W});
  ba.dbias = cuda_view(db.data(), {D});
  size_t bytes = 1;
  ASSERT_EQ(cakeConv1dBackwardWorkspaceSize(&ba, &bytes), cakeSuccess) << cakeGetLastError();
  ASSERT_EQ(bytes, 0u);
  ASSERT_EQ(cakeConv1dBackward(&ba, nullptr, 0, nullptr), cakeSuccess) << cakeGetLastError();
  for (int64_t i = 0; i < D * W; ++i) EXPECT_EQ(dw[i], 0.f) << "dweight " << i;
  for (int64_t i = 0; i < D; ++i) EXPECT_EQ(db[i], 0.f) << "dbias " << i;
}

TEST(EmulatedConv1d, SeveralChannelBlocks) {
  // 128 threads x 4 channels = 512 channels a block: 1032 spans three, the third partly.
  check_case<__nv_bfloat16>({{3, 40}, 1032, 4}, 300);
}

// The kernels' input ring (conv1d.cuh, RowRing) at its edges: D of one channel, of a partial
// vector, one past and one short of a 512-channel block, a partial third block, four whole ones
// (bulk copies where D sizeof(T) is a multiple of 16 and the bases aligned, else each thread's
// own loads; `shift` misaligns the bases); 1 to 8 documents of 0 to 200 tokens, many of 1 to
// W + 1, so that documents start anywhere in the 8-token stages and the 128-token tiles; bias,
// residual and states each on and off.
TEST(EmulatedConv1d, RingEdges) {
  std::mt19937 draw(11);
  uint64_t seed = 500;
  int variant = 0;
  for (int64_t D : {1, 3, 5, 8, 511, 513, 1032, 2048}) {
    for (int W = 2; W <= 4; ++W) {
      std::vector<int64_t> lengths(1 + draw() % 8);
      for (int64_t& n : lengths) {
        unsigned const kind = draw() % 3;
        n = kind == 0 ? draw() % 201 : kind == 1 ? 1 + draw() % (W + 1) : draw() % 3;
      }
      Options o;
      o.bias = variant & 1;
      o.residual = variant & 2;
      o.states = variant & 4;
      o.shift = variant % 5 == 4 ? 1 : 0;
      ++variant;
      SCOPED_TRACE("D = " + std::to_string(D) + ", W = " + std::to_string(W) + ", variant " +
                   std::to_string(variant));
      switch (variant % 3) {
        case 0:
          check_case<__nv_bfloat16>({lengths, D, W}, seed++, o);
          break;
        case 1:
          check_case<__half>({lengths, D, W}, seed++, o);
          break;
        default:
          check_case<float>({lengths, D, W}, seed++, o);
      }
    }
  }
}

}  // namespace
