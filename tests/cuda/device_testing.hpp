// Helpers of the GPU checks (gdn_check.cpp, kkt_check.cu, walk_bwd_check.cu): host <-> device
// copies, the kernels' Problem of a packed batch, a median time, errors against a reference.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/problem.hpp"

namespace cake::testing {

// A device copy of host (at least 16 bytes, so that empty inputs still get an address), or
// nullptr when the allocation fails.
template <class T>
T* device_copy(std::vector<T> const& host) {
  T* dev = nullptr;
  if (cudaMalloc(&dev, std::max<size_t>(host.size() * sizeof(T), 16)) != cudaSuccess)
    return nullptr;
  cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return dev;
}

template <class T>
std::vector<T> host_copy(T const* dev, size_t n) {
  std::vector<T> host(n);
  cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

// The Problem of documents with cumulative lengths cu (the caller sets cu_seqlens32).
inline kernels::Problem make_problem(std::vector<int32_t> const& cu, int H, int HV) {
  kernels::Problem p;
  p.num_seqs = static_cast<int32_t>(cu.size()) - 1;
  p.num_tokens = cu.back();
  p.num_qk_heads = H;
  p.num_v_heads = HV;
  p.num_slots = kernels::slots_for(p.num_tokens, p.num_seqs);
  return p;
}

// The median of `runs` timed calls of launch() (CUDA events on the default stream), after two
// untimed ones.
template <class Launch>
float median_ms(Launch const& launch, int runs) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 2; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Workload A of bench/workloads.json, the shape every check times: its documents and heads.
inline std::vector<int32_t> const kWorkloadADocs{98304, 65536, 57344, 40960};
inline constexpr int kWorkloadAH = 16;
inline constexpr int kWorkloadAHV = 48;

// The workloads of bench/workloads.json that the op timings take (gdn_check --workload):
// documents, q/k and value heads, and the op: GDN's single-GPU ones, and KDA's P4 at H = HV = 4,
// 16 and 64 and its grouped shape (A's documents, 16 / 48 heads); and "job", a batch of the main
// job (python -m cake.train's GPU defaults: 4 q/k and 8 value heads, 32,768 tokens in 6
// documents: 48 walks on 132 SMs, where the walks' chunk steps set the op's time).
struct Workload {
  char const* name;
  std::vector<int32_t> docs;
  int H, HV;
  bool kda = false;
};
inline std::vector<int32_t> const kKdaP4Docs{42024, 57573, 73122, 88673};
inline std::vector<Workload> const kWorkloads{
    {"A", kWorkloadADocs, kWorkloadAH, kWorkloadAHV},
    {"G",
     {3598, 4930, 6262, 7595, 8927, 10259, 11591, 12923, 14255, 15588, 16920, 18224},
     16,
     48},
    {"M", {12000, 9000, 6000, 3768, 2000}, 16, 48},
    {"N", {2049, 3001, 3142}, 2, 6},
    {"kda-P4-4", kKdaP4Docs, 4, 4, true},
    {"kda-P4-16", kKdaP4Docs, 16, 16, true},
    {"kda-P4-64", kKdaP4Docs, 64, 64, true},
    {"kda-A", kWorkloadADocs, kWorkloadAH, kWorkloadAHV, true},
    {"job", {8192, 8192, 7082, 4933, 3259, 1110}, 4, 8},
};

// cu_seqlens of packed documents of the given lengths.
inline std::vector<int32_t> cu_seqlens_of(std::vector<int32_t> const& docs) {
  std::vector<int32_t> cu{0};
  for (int32_t const len : docs) cu.push_back(cu.back() + len);
  return cu;
}

// Relative RMS and max-abs / max|ref| errors of got against ref (absolute where ref is all
// zero); pass() is the accuracy gate of bench/workloads.json unless tighter bounds are given.
struct Errors {
  double rel_rms = 0, max_rel = 0;
  bool finite = true;
  bool pass(double rel_tol = 1e-2, double max_tol = 2e-2) const {
    return finite && rel_rms <= rel_tol && max_rel <= max_tol;
  }
};

inline Errors compare(std::vector<double> const& got, std::vector<double> const& ref) {
  Errors e;
  double num = 0, den = 0, max_err = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) e.finite = false;
    double const d = got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
    max_err = std::max(max_err, std::abs(d));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  e.rel_rms = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  e.max_rel = max_ref > 0 ? max_err / max_ref : max_err;
  if (!e.finite) e.rel_rms = e.max_rel = NAN;
  return e;
}

}  // namespace cake::testing
