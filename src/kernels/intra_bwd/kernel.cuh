// The KDA intra pass (ChannelDecay's backward, after the reverse walk): one CTA per (chunk, q/k
// head) forms, for each value head of the group in turn, the adjoints of the chunk's gated
// products and finishes dq, dk, dg and dbeta, as the FP64 model's intra_backward
// (ref/kda_walk_model.hpp). With M = diag(beta) dL, d_t = e^{g_t} per channel and
// Gamma_ij = e^{G_i - G_j} = d_{j+1} ... d_i (i >= j):
//
//   row side (row r):     aq_r = sum_{j < r} dQK_rj k_j o Gamma_rj
//                         ak_r = beta_r sum_{j < r} dL_rj k_j o Gamma_rj
//   column side (col r):  ac_r = sum_{i > r} (dQK_ir q_i + beta_i dL_ir k_i) o Gamma_ir
//   dq_r = aq_r + dQK_rr k_r + dqg_r o e_r
//   dk_r = ak_r + ac_r + dQK_rr q_r + dkg_r o e_r + dkbar_r o ebar_r
//   dG_r = q_r o aq_r + k_r o (ak_r - ac_r) + dqg_r o q_r o e_r + dkg_r o k_r o e_r
//          - dkbar_r o k_r o ebar_r (r < last); the last row also gets gamma o dgamma and the
//          sum of dkbar o k o ebar over the other rows
//   dg = reverse cumsum of dG        dbeta_r = dbeta_walk_r + sum_{j < r} dL_rj S_rj
//
// (dQK's diagonal pairs enter dq and dk but not dG, where they cancel exactly.) Each factor
// Gamma is a running product of the per-token factors d_t <= 1, walked outwards from the
// diagonal: one exponential per token and channel instead of one per pair, no overflow whatever
// the gates, and a product that underflows belongs to a pair whose true factor is smaller still.
// S (for dbeta) is the gated K K^T of kkt_solve (channel_kkt.cuh). A thread owns one channel and
// every kPhases-th pair of rows of the chunk (the phases cost about the same: r steps on the row
// side, len - r on the column side); one walk serves both rows of a pair, which halves the loads
// and the running products and gives each step four independent sums. The warp's lanes are 32
// channels of one row, so dQK and dL are read as broadcasts. fp32 throughout, in fixed orders
// (deterministic); dq and dk summed over the group's value heads in ascending order as they come
// (each thread adds to the sums it stored for the heads before), so q and k are loaded once per
// group and no terms per value head are written.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"
#include "kernels/common/tile.cuh"
#include "kernels/intra_bwd/params.hpp"
#include "kernels/kkt_solve/channel_kkt.cuh"

namespace cake::kernels::intra_bwd {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
// Thread tid owns key channel tid % 128 and the row pairs of phase tid / 128.
inline constexpr int kPhases = kThreads / kHeadDim;
using kkt_solve::kLdGate;

// About 190 KB: one CTA per SM.
struct SharedStorage {
  __nv_bfloat16 q[kChunk * kLdBf16];  // [64 x 128] (zero past the end)
  __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128]
  float gcum[kChunk * kLdGate];       // [64 x 128] G
  float d[kChunk * kLdGate];          // [64 x 128] g, then d = e^g
  float dg[kChunk * kLdGate];         // [64 x 128] dG, before its cumsum
  float dqk[kChunk * kLd64];          // [64 x 64]
  float dl[kChunk * kLd64];           // [64 x 64]
  float s[kChunk * kLd64];            // [64 x 64] the gated K K^T (strictly lower)
  float beta[kChunk];
  float tail[kPhases * kHeadDim];  // the sum of dkbar o k o ebar over rows, per phase
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "intra_bwd shared memory exceeds 227 KB");

__global__ void __launch_bounds__(kThreads, 1) intra_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  ChunkRef c;
  if (!find_chunk(p.problem, blockIdx.x, c)) return;
  int const h = blockIdx.y;
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const group = p.problem.group_size();
  int const len = c.len;
  int const tid = threadIdx.x;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const key_stride = int64_t{HV} * kHeadDim;

  // q and k once for the group's value heads
  load_tile_async<kChunk, kHeadDim, kThreads>(s.q, kLdBf16, p.q + (c.t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  for (int gi = 0; gi < group; ++gi) {
    int const hv = h * group + gi;
    int64_t const row0 = c.t0 * HV + hv;  // [BT, HV] row of the chunk's first token
    // the previous value head's readers of d, gcum, dqk, dl, s, beta and tail are done
    if (gi > 0) __syncthreads();
    load_tile_async<kChunk, kHeadDim, kThreads>(s.d, kLdGate, p.g + row0 * kHeadDim, key_stride,
                                                len);
    load_tile_async<kChunk, kChunk, kThreads>(s.dqk, kLd64, p.dqk + row0 * kChunk,
                                              int64_t{HV} * kChunk, len);
    load_tile_async<kChunk, kChunk, kThreads>(s.dl, kLd64, p.dl + row0 * kChunk,
                                              int64_t{HV} * kChunk, len);
    cp_async_commit();
    if (tid < kChunk)
      s.beta[tid] = tid < len ? load_scalar(p.beta, row0 + int64_t{tid} * HV, p.beta_is_bf16) : 0.f;
    cp_async_wait<0>();
    __syncthreads();

    // G and d = e^g: thread c < 128 runs down channel c (past the end g is 0: G flat, d = 1)
    if (tid < kHeadDim) {
      float acc = 0.f;
      for (int r = 0; r < kChunk; ++r) {
        float const g = s.d[r * kLdGate + tid];
        acc += g;
        s.gcum[r * kLdGate + tid] = acc;
        s.d[r * kLdGate + tid] = __expf(g);
      }
    }
    __syncthreads();

    kkt_solve::channel_gated_product<kWarps, false>(s.k, s.k, s.gcum, 1.f, s.s);
    __syncthreads();  // S visible

    // dbeta_r = dbeta_walk_r + sum_{j < r} dL_rj S_rj
    if (tid < len && p.dbeta != nullptr) {
      float sum = p.dbeta_walk[row0 + int64_t{tid} * HV];
      for (int j = 0; j < tid; ++j) sum += s.dl[tid * kLd64 + j] * s.s[tid * kLd64 + j];
      int64_t const at = row0 + int64_t{tid} * HV;
      if (p.dbeta_is_bf16)
        static_cast<__nv_bfloat16*>(p.dbeta)[at] = __float2bfloat16(sum);
      else
        static_cast<float*>(p.dbeta)[at] = sum;
    }

    int const ch = tid % kHeadDim;
    int const phase = tid / kHeadDim;
    float const g_last = s.gcum[(len - 1) * kLdGate + ch];
    auto const at = [&](int row) { return row * kLdGate + ch; };
    float tail = 0.f;
    // Rows in pairs (r, r + 1), r = 2 (kPhases m + phase): both rows' sums share one walk over the
    // other rows, since Gamma_{r+1,j} = d_{r+1} Gamma_rj and Gamma_ir = d_{r+1} Gamma_{i,r+1}.
    for (int r = 2 * phase; r < len; r += 2 * kPhases) {
      int const r1 = r + 1;  // may be past the end: its tile rows are zero, its writes skipped
      // This pair's loads from global memory first, so that their latency hides behind the walks.
      int64_t const out0 = (row0 + int64_t{r} * HV) * kHeadDim + ch;
      int64_t const out1 = out0 + int64_t{HV} * kHeadDim;
      int64_t const sum_at0 = ((c.t0 + r) * H + h) * kHeadDim + ch;
      int64_t const sum_at1 = sum_at0 + qk_stride;
      bool const has1 = r1 < len;
      float const dqg0 = p.dqg[out0], dkg0 = p.dkg[out0], dkbar0 = p.dkbar[out0];
      float const dqg1 = has1 ? p.dqg[out1] : 0.f;
      float const dkg1 = has1 ? p.dkg[out1] : 0.f;
      float const dkbar1 = has1 ? p.dkbar[out1] : 0.f;
      float const dq_before0 = gi == 0 ? 0.f : p.dq[sum_at0];
      float const dk_before0 = gi == 0 ? 0.f : p.dk[sum_at0];
      float const dq_before1 = gi == 0 || !has1 ? 0.f : p.dq[sum_at1];
      float const dk_before1 = gi == 0 || !has1 ? 0.f : p.dk[sum_at1];

      float const q0 = __bfloat162float(s.q[r * kLdBf16 + ch]);
      float const k0 = __bfloat162float(s.k[r * kLdBf16 + ch]);
      float const q1 = __bfloat162float(s.q[r1 * kLdBf16 + ch]);
      float const k1 = __bfloat162float(s.k[r1 * kLdBf16 + ch]);
      float const d1 = s.d[at(r1)];
      // row side: j = r - 1 down to 0, run = Gamma_rj = d_{j+1} ... d_r
      float aq0 = 0.f, ak0 = 0.f, aq1 = 0.f, ak1 = 0.f, run = 1.f;
      for (int j = r - 1; j >= 0; --j) {
        run *= s.d[at(j + 1)];
        float const kj = __bfloat162float(s.k[j * kLdBf16 + ch]) * run;
        aq0 += s.dqk[r * kLd64 + j] * kj;
        ak0 += s.dl[r * kLd64 + j] * kj;
        aq1 += s.dqk[r1 * kLd64 + j] * kj;
        ak1 += s.dl[r1 * kLd64 + j] * kj;
      }
      ak0 *= s.beta[r];
      // row r + 1: its pair with r (Gamma = d_{r+1}), then the common factor d_{r+1}
      aq1 = d1 * (aq1 + s.dqk[r1 * kLd64 + r] * k0);
      ak1 = s.beta[r1] * d1 * (ak1 + s.dl[r1 * kLd64 + r] * k0);
      // column side: i = r + 2 up to the end, run = Gamma_{i,r+1} = d_{r+2} ... d_i
      float ac0 = 0.f, ac1 = 0.f;
      run = 1.f;
      for (int i = r + 2; i < len; ++i) {
        run *= s.d[at(i)];
        float const qi = __bfloat162float(s.q[i * kLdBf16 + ch]);
        float const bki = s.beta[i] * __bfloat162float(s.k[i * kLdBf16 + ch]);
        float2 const dqk = *reinterpret_cast<float2 const*>(&s.dqk[i * kLd64 + r]);
        float2 const dl = *reinterpret_cast<float2 const*>(&s.dl[i * kLd64 + r]);
        ac0 += (dqk.x * qi + dl.x * bki) * run;
        ac1 += (dqk.y * qi + dl.y * bki) * run;
      }
      // row r's pair with r + 1 (Gamma = d_{r+1}), then the common factor d_{r+1}
      ac0 = d1 * (ac0 + s.dqk[r1 * kLd64 + r] * q1 + s.beta[r1] * s.dl[r1 * kLd64 + r] * k1);

      // outputs of row x: a = (aq, ak, ac), its gates' terms, this value head into the group sums
      auto const finish = [&](int row, float qr, float kr, float aq, float ak, float ac,
                              float dqg, float dkg, float dkbar, float dq_before,
                              float dk_before, int64_t sum_at) {
        float const gr = s.gcum[at(row)];
        float const e = __expf(gr);
        float const eb = __expf(g_last - gr);
        float const pd = s.dqk[row * kLd64 + row];
        p.dq[sum_at] = dq_before + (aq + pd * kr + dqg * e);
        p.dk[sum_at] = dk_before + (ak + ac + pd * qr + dkg * e + dkbar * eb);
        float const bar = row < len - 1 ? dkbar * kr * eb : 0.f;
        tail += bar;
        s.dg[at(row)] = qr * aq + kr * (ak - ac) + dqg * qr * e + dkg * kr * e - bar;
      };
      finish(r, q0, k0, aq0, ak0, ac0, dqg0, dkg0, dkbar0, dq_before0, dk_before0, sum_at0);
      if (has1)
        finish(r1, q1, k1, aq1, ak1, ac1, dqg1, dkg1, dkbar1, dq_before1, dk_before1, sum_at1);
    }
    s.tail[phase * kHeadDim + ch] = tail;
    __syncthreads();  // dG and the tails visible

    // dg = reverse cumsum of dG, the last row's terms through G_last first
    if (tid < kHeadDim && p.dg != nullptr) {
      float const dgamma = p.dgamma[(blockIdx.x * int64_t{HV} + hv) * kHeadDim + tid];
      float acc = __expf(g_last) * dgamma;
      for (int ph = 0; ph < kPhases; ++ph) acc += s.tail[ph * kHeadDim + tid];
      for (int r = len - 1; r >= 0; --r) {
        acc += s.dg[r * kLdGate + tid];
        p.dg[(row0 + int64_t{r} * HV) * kHeadDim + tid] = acc;
      }
    }
  }
#endif
}

}  // namespace cake::kernels::intra_bwd
