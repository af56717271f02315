// The KDA intra pass (ChannelDecay's backward, after the reverse walk): for each (chunk, q/k head)
// item, and each value head of the group in turn, it forms the adjoints of the chunk's gated
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
//                                            = dbeta_walk_r + sum_c k_rc (ak_r / beta_r)_c
//
// (dQK's diagonal pairs enter dq and dk but not dG, where they cancel exactly.) Each factor
// Gamma is a running product of the per-token factors d_t <= 1, walked outwards from the
// diagonal: one exponential per token and channel instead of one per pair, no overflow whatever
// the gates, and a product that underflows belongs to a pair whose true factor is smaller still.
// With S_rj = sum_c k_rc k_jc Gamma_rj,c (the gated K K^T), dbeta's sum is the channel sum of
// k_r o ak_r before its factor beta_r, which the row side forms anyway: S itself is not formed
// (fp32 running products here, where kkt_solve's S has bf16 tensor-core operands). A thread owns
// one channel and every kPhases-th group of four rows of the chunk (the phases cost about the
// same: r steps on the row side, len - r on the column side); one walk serves the group's four
// rows, which divides the loads and running products by four and gives each step eight (row
// side) or four (column side, one float4 of dQK and of dL) independent sums. The warp's lanes are
// 32 channels of one row, so dQK and dL are read as broadcasts. fp32 throughout, in fixed orders
// (deterministic); dq and dk summed over the group's value heads in ascending order as they come
// (each thread adds to the sums it stored for the heads before), so q and k are loaded once per
// group and no terms per value head are written. At the last value head the sums are finished in
// place of a separate pass: a row group's sums go to shared memory, and each of the phase's four
// warps takes one row through the L2 norm's backward to bf16 (qk_grad's finish_row: the same dot
// tree, so the same bits as summing to fp32 and finishing there). One CTA per SM walks its share of
// the items, step by step (an item's value heads, then its next item): a step's tile loads start
// once the walks of the step before are done, so that their latency overlaps that step's dbeta and
// dg (and, prefetched into L2 during the walks, is L2's), with no CTA launch or chunk lookup
// between items.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"
#include "kernels/common/ptx.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/intra_bwd/params.hpp"
#include "kernels/kkt_solve/channel_kkt.cuh"
#include "kernels/qk_grad/finish_row.cuh"

namespace cake::kernels::intra_bwd {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
// Thread tid owns key channel tid % 128 and the row groups of phase tid / 128.
inline constexpr int kPhases = kThreads / kHeadDim;
inline constexpr int kGroupRows = 4;  // rows that share one walk
using kkt_solve::kLdGate;

// A unit of work: one chunk (slot) and one q/k head, item u = slot + num_slots h.
struct Item {
  int64_t u;
  ChunkRef c;
  int h;
};

// About 224 KB: one CTA per SM.
struct SharedStorage {
  __nv_bfloat16 q[kChunk * kLdBf16];  // [64 x 128] (zero past the end)
  __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128]
  float gcum[kChunk * kLdGate];       // [64 x 128] G
  float d[kChunk * kLdGate];          // [64 x 128] g, then d = e^g
  float dg[kChunk * kLdGate];         // [64 x 128] dG, before its cumsum
  float bk[kChunk * kLdGate];         // [64 x 128] beta_i k_i, row i
  float dqk[kChunk * kLd64];          // [64 x 64]
  float dl[kChunk * kLd64];           // [64 x 64]
  // the last value head's dq, dk of a row group, per phase: [kPhases x 4 rows x {dq, dk} x 128]
  alignas(16) float sums[kPhases][kGroupRows][2][kHeadDim];
  float beta[kChunk];
  float dbeta_walk[kChunk];
  float dbeta_part[kChunk * kHeadDim / 32];  // [64 x 4] k o ak (before beta) summed per warp
  float tail[kPhases * kHeadDim];            // the sum of dkbar o k o ebar over rows, per phase
  Item cur;   // this step's item, for after the walks (no registers held through them)
  Item next;  // this CTA's next item (next.c.len 0: none)
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "intra_bwd shared memory exceeds 227 KB");

__global__ void __launch_bounds__(kThreads, 1) intra_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const group = p.problem.group_size();
  int const num_slots = p.problem.num_slots;
  int const tid = threadIdx.x;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const key_stride = int64_t{HV} * kHeadDim;

  // The CTA's items are blockIdx.x + k gridDim.x (one CTA per SM, items of about the same cost);
  // find_item(u) finds the first of them from u on whose slot holds a chunk. Every lane of a warp
  // calls it (find_chunk).
  auto const find_item = [&](int64_t u, Item& it) {
    for (; u < int64_t{num_slots} * H; u += gridDim.x)
      if (find_chunk(p.problem, u % num_slots, it.c)) {
        it.u = u;
        it.h = static_cast<int>(u / num_slots);
        return true;
      }
    return false;
  };
  // A (value head, item) step's tiles: q and k with the item's first value head, then g, dQK and
  // dL of value head hv, into the tiles whose last readers were the previous step's walks.
  auto const load_tiles = [&](ChunkRef const& c, int h, int hv, bool with_qk) {
    if (with_qk) {
      load_tile_async<kChunk, kHeadDim, kThreads>(s.q, kLdBf16, p.q + (c.t0 * H + h) * kHeadDim,
                                                  qk_stride, c.len);
      load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                                  qk_stride, c.len);
    }
    int64_t const row0 = c.t0 * HV + hv;
    load_tile_async<kChunk, kHeadDim, kThreads>(s.d, kLdGate, p.g + row0 * kHeadDim, key_stride,
                                                c.len);
    load_tile_async<kChunk, kChunk, kThreads>(s.dqk, kLd64, p.dqk + row0 * kChunk,
                                              int64_t{HV} * kChunk, c.len);
    load_tile_async<kChunk, kChunk, kThreads>(s.dl, kLd64, p.dl + row0 * kChunk,
                                              int64_t{HV} * kChunk, c.len);
    cp_async_commit();
  };
  // beta_t (thread t < 64) and dbeta_walk_t (thread 128 + t, its reader below) of value head hv
  auto const beta_at = [&](ChunkRef const& c, int hv) {
    int const t = tid % kChunk;
    if (t >= c.len) return 0.f;
    int64_t const at = (c.t0 + t) * HV + hv;
    if (tid < kChunk) return load_scalar(p.beta, at, p.beta_is_bf16);
    return tid / kChunk == 2 && p.dbeta != nullptr ? p.dbeta_walk[at] : 0.f;
  };

  Item it;
  if (!find_item(blockIdx.x, it)) return;
  int gi = 0;
  load_tiles(it.c, it.h, it.h * group, true);
  {
    float const b = beta_at(it.c, it.h * group);
    if (tid < kChunk)
      s.beta[tid] = b;
    else if (tid / kChunk == 2)
      s.dbeta_walk[tid % kChunk] = b;
  }
  for (;;) {
    ChunkRef const c = it.c;
    int const h = it.h;
    int const len = c.len;
    int const hv = h * group + gi;
    int64_t const row0 = c.t0 * HV + hv;  // [BT, HV] row of the chunk's first token
    cp_async_wait<0>();
    __syncthreads();

    // G and d = e^g: thread c < 128 runs down channel c (past the end g is 0: G flat, d = 1);
    // meanwhile the other 384 form beta o k for the column side (one load and one product fewer
    // per step there)
    if (tid < kHeadDim) {
      float acc = 0.f;
      for (int r = 0; r < kChunk; ++r) {
        float const g = s.d[r * kLdGate + tid];
        acc += g;
        s.gcum[r * kLdGate + tid] = acc;
        s.d[r * kLdGate + tid] = __expf(g);
      }
    } else {
      // eight channels at a time: one 16-byte load of k, two 16-byte stores of beta o k
      constexpr int kVec = 8;
      for (int x = tid - kHeadDim; x < kChunk * kHeadDim / kVec; x += kThreads - kHeadDim) {
        int const i = x / (kHeadDim / kVec);
        int const c0 = x % (kHeadDim / kVec) * kVec;
        alignas(16) __nv_bfloat16 k8[kVec];
        alignas(16) float bk8[kVec];
        *reinterpret_cast<uint4*>(k8) = *reinterpret_cast<uint4 const*>(&s.k[i * kLdBf16 + c0]);
        float const beta_i = s.beta[i];
#pragma unroll
        for (int v = 0; v < kVec; ++v) bk8[v] = beta_i * __bfloat162float(k8[v]);
        float4* const to = reinterpret_cast<float4*>(&s.bk[i * kLdGate + c0]);
        to[0] = *reinterpret_cast<float4 const*>(&bk8[0]);
        to[1] = *reinterpret_cast<float4 const*>(&bk8[4]);
      }
    }
    // The CTA's next item: the last warp finds it beside the cumsum (after its share of beta o
    // k); the threads bring its tiles into L2 in their last row group of the item's last value
    // head (prefetch_l2), and its loads start once the walks are done. Read after the barriers
    // below.
    if (gi == 0 && tid / 32 == kWarps - 1) {
      Item nx{};
      bool const has = find_item(it.u + gridDim.x, nx);
      if (tid % 32 == 0) {
        s.next = nx;
        if (!has) s.next.c.len = 0;
      }
    }
    if (tid == kThreads - 1) s.cur = it;
    __syncthreads();

    int const ch = tid % kHeadDim;
    int const phase = tid / kHeadDim;
    float const g_last = s.gcum[(len - 1) * kLdGate + ch];
    auto const at = [&](int row) { return row * kLdGate + ch; };
    float tail = 0.f;
    bool const last_head = gi + 1 == group;  // the sums are finished (to bf16) at this step
    // Rows in groups of kGroupRows, r = kGroupRows (kPhases m + phase): the group's sums share one
    // walk over the other rows, since with e_l = d_{r+l}, Gamma_{r+m,j} = e_1 ... e_m Gamma_rj for
    // j < r and Gamma_{i,r+m} = e_{m+1} ... e_{R-1} Gamma_{i,r+R-1} for i >= r + R; the pairs
    // inside the group are added after the walks, in Horner form (no division).
    constexpr int R = kGroupRows;
    for (int r = R * phase; r < len; r += R * kPhases) {
      // This group's loads from global memory first, so that their latency hides behind the
      // walks; rows past the end have zero tile rows, and their loads and writes are skipped.
      int64_t const out0 = (row0 + int64_t{r} * HV) * kHeadDim + ch;
      int64_t const sum_at0 = ((c.t0 + r) * H + h) * kHeadDim + ch;
      float dqg[R], dkg[R], dkbar[R], dq_before[R] = {}, dk_before[R] = {};
#pragma unroll
      for (int m = 0; m < R; ++m) {
        bool const valid = r + m < len;
        int64_t const out = out0 + int64_t{m} * HV * kHeadDim;
        dqg[m] = valid ? p.dqg[out] : 0.f;
        dkg[m] = valid ? p.dkg[out] : 0.f;
        dkbar[m] = valid ? p.dkbar[out] : 0.f;
      }
      // the sums of the heads before (a uniform branch: none for the group's first head, so no
      // predicated-off address arithmetic is issued there)
      if (gi > 0) {
#pragma unroll
        for (int m = 0; m < R; ++m) {
          int64_t const sum_at = sum_at0 + m * qk_stride;
          if (r + m < len) {
            dq_before[m] = p.dq_sum[sum_at];
            dk_before[m] = p.dk_sum[sum_at];
          }
        }
      }
      // the last row group of the last value head: one row of the next item's q, k, g, dQK or
      // dL tile per thread (its first value head's; a warp's lanes take one tile), a prefetch per
      // 128-byte line
      if (last_head && r + R * kPhases >= len && tid < 5 * kChunk && tid % kChunk < s.next.c.len) {
        int64_t const t = s.next.c.t0 + tid % kChunk;
        int64_t const qk_row = (t * H + s.next.h) * kHeadDim;
        int64_t const hv_row = t * HV + int64_t{s.next.h} * group;
        auto const lines = [](auto const* row, int n) {  // the n elements at row
          int const bytes = n * static_cast<int>(sizeof(*row));
          for (int b = 0; b < bytes; b += 128) prefetch_l2(reinterpret_cast<char const*>(row) + b);
        };
        switch (tid / kChunk) {  // the same for a warp's lanes
          case 0:
            lines(p.q + qk_row, kHeadDim);
            break;
          case 1:
            lines(p.k + qk_row, kHeadDim);
            break;
          case 2:
            lines(p.g + hv_row * kHeadDim, kHeadDim);
            break;
          case 3:
            lines(p.dqk + hv_row * kChunk, kChunk);
            break;
          default:
            lines(p.dl + hv_row * kChunk, kChunk);
        }
      }
      // row side: j = r - 1 down to 0, run = Gamma_rj = d_{j+1} ... d_r; r is a multiple of
      // four, so j comes in aligned quads j0 .. j0 + 3, each read as one float4 of dQK and one of
      // dL per row (a quarter of the loads of one per step); the sums take j in descending order
      float aq[R] = {}, ak[R] = {};
      float run = 1.f;
#pragma unroll 1  // one quad a trip: 128 registers hold no more
      for (int j0 = r - 4; j0 >= 0; j0 -= 4) {
        float kj[4];
#pragma unroll
        for (int l = 3; l >= 0; --l) {
          run *= s.d[at(j0 + l + 1)];
          kj[l] = __bfloat162float(s.k[(j0 + l) * kLdBf16 + ch]) * run;
        }
#pragma unroll
        for (int m = 0; m < R; ++m) {
          float4 const dqk = *reinterpret_cast<float4 const*>(&s.dqk[(r + m) * kLd64 + j0]);
          float4 const dl = *reinterpret_cast<float4 const*>(&s.dl[(r + m) * kLd64 + j0]);
          aq[m] += dqk.w * kj[3];
          ak[m] += dl.w * kj[3];
          aq[m] += dqk.z * kj[2];
          ak[m] += dl.z * kj[2];
          aq[m] += dqk.y * kj[1];
          ak[m] += dl.y * kj[1];
          aq[m] += dqk.x * kj[0];
          ak[m] += dl.x * kj[0];
        }
      }
      // the group's own rows, read after the row side's walk (fewer registers live through it)
      float qv[R], kv[R], e[R];
#pragma unroll
      for (int m = 0; m < R; ++m) {
        qv[m] = __bfloat162float(s.q[(r + m) * kLdBf16 + ch]);
        kv[m] = __bfloat162float(s.k[(r + m) * kLdBf16 + ch]);
        e[m] = s.d[at(r + m)];
      }
      // the pairs (r + m, r + l), l < m, then the factors e_{l+1}
#pragma unroll
      for (int m = 1; m < R; ++m) {
#pragma unroll
        for (int l = 0; l < m; ++l) {
          aq[m] = e[l + 1] * (aq[m] + s.dqk[(r + m) * kLd64 + r + l] * kv[l]);
          ak[m] = e[l + 1] * (ak[m] + s.dl[(r + m) * kLd64 + r + l] * kv[l]);
        }
      }
      // dbeta's sum over this warp's 32 channels of k o ak (before beta) for the group's four
      // rows at once, in a fixed order: the lanes trade halves of their rows (xor 16: the lanes
      // with bit 4 set keep rows 2, 3, the others rows 0, 1; xor 8: one row each by bit 3), then
      // a butterfly over the other three bits; lane 8 m ends with row m's sum. Six shuffles for
      // the four rows, not twenty. Rows past the end have ak = 0.
      if (p.dbeta != nullptr) {
        static_assert(R == 4, "the dbeta reduction trades four rows");
        int const lane = tid % 32;
        float v[R];
#pragma unroll
        for (int m = 0; m < R; ++m) v[m] = kv[m] * ak[m];
        bool const hi16 = lane & 16, hi8 = lane & 8;
        float const a = (hi16 ? v[2] : v[0]) + __shfl_xor_sync(0xffffffffu, hi16 ? v[0] : v[2], 16);
        float const b = (hi16 ? v[3] : v[1]) + __shfl_xor_sync(0xffffffffu, hi16 ? v[1] : v[3], 16);
        float part = (hi8 ? b : a) + __shfl_xor_sync(0xffffffffu, hi8 ? a : b, 8);
#pragma unroll
        for (int d = 4; d > 0; d /= 2) part += __shfl_xor_sync(0xffffffffu, part, d);
        if (lane % 8 == 0) s.dbeta_part[(r + lane / 8) * (kHeadDim / 32) + ch / 32] = part;
      }
#pragma unroll
      for (int m = 0; m < R; ++m) ak[m] *= s.beta[r + m];
      // column side: i = r + R up to the end, run = Gamma_{i,r+R-1} = d_{r+R} ... d_i; q_i and
      // beta_i k_i scaled by run once a step, as the row side scales k_j (two products a step and
      // two fused sums a column, not four products and eight fused ones), four steps a trip
      static_assert(R == 4, "the column side reads the group's four columns as one float4");
      float ac[R] = {};
      run = 1.f;
#pragma unroll 4
      for (int i = r + R; i < len; ++i) {
        run *= s.d[at(i)];
        float const qr = __bfloat162float(s.q[i * kLdBf16 + ch]) * run;
        float const bkr = s.bk[at(i)] * run;
        float4 const dqk = *reinterpret_cast<float4 const*>(&s.dqk[i * kLd64 + r]);
        float4 const dl = *reinterpret_cast<float4 const*>(&s.dl[i * kLd64 + r]);
        ac[0] += dqk.x * qr;
        ac[1] += dqk.y * qr;
        ac[2] += dqk.z * qr;
        ac[3] += dqk.w * qr;
        ac[0] += dl.x * bkr;
        ac[1] += dl.y * bkr;
        ac[2] += dl.z * bkr;
        ac[3] += dl.w * bkr;
      }
      // the pairs (r + l, r + m), l > m, then the factors e_l
#pragma unroll
      for (int m = 0; m < R - 1; ++m) {
#pragma unroll
        for (int l = R - 1; l > m; --l) {
          int const il = (r + l) * kLd64 + r + m;
          ac[m] = e[l] * (ac[m] + s.dqk[il] * qv[l] + s.beta[r + l] * s.dl[il] * kv[l]);
        }
      }

      // each row's outputs: its gates' terms, this value head into the group sums
#pragma unroll
      for (int m = 0; m < R; ++m) {
        int const row = r + m;
        if (row >= len) break;
        float const gr = s.gcum[at(row)];
        float const eg = __expf(gr);
        float const eb = __expf(g_last - gr);
        float const pd = s.dqk[row * kLd64 + row];
        float const dq = dq_before[m] + (aq[m] + pd * kv[m] + dqg[m] * eg);
        float const dk = dk_before[m] + (ak[m] + ac[m] + pd * qv[m] + dkg[m] * eg + dkbar[m] * eb);
        if (last_head) {
          s.sums[phase][m][0][ch] = dq;
          s.sums[phase][m][1][ch] = dk;
        } else {
          int64_t const sum_at = sum_at0 + m * qk_stride;
          p.dq_sum[sum_at] = dq;
          p.dk_sum[sum_at] = dk;
        }
        float const bar = row < len - 1 ? dkbar[m] * kv[m] * eb : 0.f;
        tail += bar;
        s.dg[at(row)] = qv[m] * aq[m] + kv[m] * (ak[m] - ac[m]) + dqg[m] * qv[m] * eg +
                        dkg[m] * kv[m] * eg - bar;
      }
      // the last value head: the group's rows finished, warp w of the phase taking row r + w
      // (its 128 channels, 4 a lane), between two barriers of the phase's 128 threads (the row
      // group's sums all stored; then read before the next group overwrites them)
      if (last_head) {
        named_barrier_sync(1 + phase, kHeadDim);
        int const m = ch / 32;
        if (r + m < len) {
          int64_t const qk_row = (c.t0 + r + m) * H + h;
#pragma unroll 1  // dq, then dk (fewer registers than both at once)
          for (int x = 0; x < 2; ++x) {
            __nv_bfloat16* const dx = x == 0 ? p.dq : p.dk;
            if (dx == nullptr) continue;
            float const* const rstd = x == 0 ? p.q_rstd : p.k_rstd;
            qk_grad::finish_row(p.use_l2norm, &(x == 0 ? s.q : s.k)[(r + m) * kLdBf16],
                                p.use_l2norm ? rstd[qk_row] : 0.f,
                                reinterpret_cast<float4 const*>(s.sums[phase][m][x])[tid % 32],
                                dx + qk_row * kHeadDim);
          }
        }
        named_barrier_sync(1 + phase, kHeadDim);
      }
    }
    s.tail[phase * kHeadDim + ch] = tail;
    __syncthreads();  // dG, the tails and dbeta's parts visible; the tiles free

    // The next step (the item's next value head, or the next item) starts its loads now, beside
    // this step's dbeta and dg: its tiles land while they run. Its beta and dbeta_walk go to
    // shared memory once this step's readers of them are done (below).
    Item const nx = last_head ? s.next : s.cur;
    bool const more = !last_head || nx.c.len > 0;
    int const next_gi = last_head ? 0 : gi + 1;
    float beta_next = 0.f;
    if (more) {
      load_tiles(nx.c, nx.h, nx.h * group + next_gi, last_head);
      beta_next = beta_at(nx.c, nx.h * group + next_gi);
    }

    // dbeta_r = dbeta_walk_r + the four warps' parts in order, by threads 128 + r (beside the
    // cumsum below)
    if (tid >= kHeadDim && tid < kHeadDim + len && p.dbeta != nullptr) {
      int const r = tid - kHeadDim;
      float part = 0.f;
#pragma unroll
      for (int w = 0; w < kHeadDim / 32; ++w) part += s.dbeta_part[r * (kHeadDim / 32) + w];
      float const sum = s.dbeta_walk[r] + part;
      int64_t const at = row0 + int64_t{r} * HV;
      if (p.dbeta_is_bf16)
        static_cast<__nv_bfloat16*>(p.dbeta)[at] = __float2bfloat16(sum);
      else
        static_cast<float*>(p.dbeta)[at] = sum;
    }
    if (more && tid / kChunk == 2) s.dbeta_walk[tid % kChunk] = beta_next;

    // dg = reverse cumsum of dG, the last row's terms through G_last first
    if (tid < kHeadDim && p.dg != nullptr) {
      int64_t const slot = s.cur.u % num_slots;
      float const dgamma = p.dgamma[(slot * HV + hv) * kHeadDim + tid];
      float acc = __expf(g_last) * dgamma;
      for (int ph = 0; ph < kPhases; ++ph) acc += s.tail[ph * kHeadDim + tid];
      for (int r = len - 1; r >= 0; --r) {
        acc += s.dg[r * kLdGate + tid];
        p.dg[(row0 + int64_t{r} * HV) * kHeadDim + tid] = acc;
      }
    }
    if (!more) break;
    if (tid < kChunk) s.beta[tid] = beta_next;
    it = nx;
    gi = next_gi;
  }
#endif
}

}  // namespace cake::kernels::intra_bwd
