// Random packed GDN problems for the kernel checks (the GPU check, tests/cuda/walk_bwd_check.cu,
// and the CPU emulator's tests, tests/emu): bf16 q, k, v, dO and fp32 g, beta, states, rounded
// the way the kernels read them, with the values the FP64 reference gets (the same ones).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/problem.hpp"
#include "ref/chunked.hpp"

namespace cake::gdn_testing {


constexpr int K = kernels::kHeadDim;

struct Case {
  std::string name;
  std::vector<int> docs;
  int H = 1;
  int HV = 2;
  float g_lo = -1.f;  // g uniform in [g_lo, g_hi]
  float g_hi = 0.f;
  float beta_lo = 0.f;  // beta uniform in [beta_lo, beta_hi]
  float beta_hi = 1.f;
  bool states = true;  // h0 and dht given, ht and dh0 wanted
};

// One problem's inputs, each in the dtype a kernel reads and (as double) the values the
// reference gets.
struct Problem {
  std::vector<int32_t> cu;
  int64_t BT = 0;
  int H = 0, HV = 0, N = 0;
  double scale = 0;
  std::vector<double> q, k, v, dout, g, beta, h0, dht;  // rounded as the kernels see them
  std::vector<__nv_bfloat16> q16, k16, v16, dout16;
  std::vector<float> g32, beta32, h0_32, dht32;

  kernels::Problem kernel_problem() const {
    kernels::Problem p;
    p.num_seqs = N;
    p.num_tokens = BT;
    p.num_qk_heads = H;
    p.num_v_heads = HV;
    p.num_slots = kernels::slots_for(BT, N);
    p.cu_seqlens32 = cu.data();
    p.scale = static_cast<float>(scale);
    return p;
  }
  ref::Shape shape() const {
    ref::Shape s;
    s.num_tokens = BT;
    s.num_qk_heads = H;
    s.num_v_heads = HV;
    s.head_dim_k = K;
    s.head_dim_v = K;
    s.cu_seqlens.assign(cu.begin(), cu.end());
    return s;
  }
  int64_t states_size() const { return int64_t{N} * HV * K * K; }
};

inline std::vector<__nv_bfloat16> to_bf16(std::vector<double>& x) {  // rounds x in place
  std::vector<__nv_bfloat16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = __float2bfloat16(static_cast<float>(x[i]));
    x[i] = __bfloat162float(out[i]);
  }
  return out;
}
inline std::vector<float> to_f32(std::vector<double>& x) {
  std::vector<float> out(x.begin(), x.end());
  for (size_t i = 0; i < x.size(); ++i) x[i] = out[i];
  return out;
}

// q, k as unit rows (as after the q/k L2 norm), v, dO ~ N(0, 1), g and beta uniform in the case's
// ranges, states ~ N(0, 1) when the case has them.
inline Problem make_problem(Case const& c, std::mt19937& rng) {
  Problem p;
  p.cu = {0};
  for (int len : c.docs) p.cu.push_back(p.cu.back() + len);
  p.BT = p.cu.back();
  p.H = c.H;
  p.HV = c.HV;
  p.N = static_cast<int>(c.docs.size());
  p.scale = 1.0 / std::sqrt(static_cast<double>(K));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto normal_vec = [&](int64_t n) {
    std::vector<double> x(n);
    for (auto& e : x) e = normal(rng);
    return x;
  };
  auto unit_rows = [&](int64_t rows) {
    std::vector<double> x = normal_vec(rows * K);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < K; ++i) ss += x[r * K + i] * x[r * K + i];
      for (int i = 0; i < K; ++i) x[r * K + i] /= std::sqrt(ss);
    }
    return x;
  };
  p.q = unit_rows(p.BT * p.H);
  p.k = unit_rows(p.BT * p.H);
  p.v = normal_vec(p.BT * p.HV * K);
  p.dout = normal_vec(p.BT * p.HV * K);
  p.g.resize(p.BT * p.HV);
  p.beta.resize(p.BT * p.HV);
  for (auto& x : p.g) x = c.g_lo + (c.g_hi - c.g_lo) * unit(rng);
  for (auto& x : p.beta) x = c.beta_lo + (c.beta_hi - c.beta_lo) * unit(rng);
  if (c.states) {
    p.h0 = normal_vec(p.states_size());
    p.dht = normal_vec(p.states_size());
  }
  p.q16 = to_bf16(p.q);
  p.k16 = to_bf16(p.k);
  p.v16 = to_bf16(p.v);
  p.dout16 = to_bf16(p.dout);
  p.g32 = to_f32(p.g);
  p.beta32 = to_f32(p.beta);
  p.h0_32 = to_f32(p.h0);
  p.dht32 = to_f32(p.dht);
  return p;
}

}  // namespace cake::gdn_testing
