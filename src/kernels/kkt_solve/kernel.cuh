// The chunk inverse of the delta rule, for the decay policy Decay (common/decay.hpp): per work item
// (chunk, q/k head), the value heads of its group in turn (grouped value heads share the keys, so
// K is loaded once for the group); one CTA per item, or persistent CTAs (ChannelDecay, below).
//
// ScalarDecay (GDN), the un-gated inverse (step 1 of docs/design/gdn-hopper-fused-walks.md), with
// K K^T formed once for the group:
//
//   S    = K K^T                                                       [64 x 64] fp32, once
//   per value head hv of the group:
//   G    = cumsum(g) within the chunk                                  [64]      fp32 out
//   L_ij = beta_i S_ij  (i > j), strictly lower (never formed: the solve scales S's rows)
//   A    = (I + L)^-1                                                  [64 x 64] bf16 out
//
// Why no gate: with Gamma_ij = e^{G_i - G_j} and D = diag(e^G), Gamma o L = D L D^-1, so the
// gated inverse T = (I + Gamma o L)^-1 = D A D^-1 = Gamma o A: the gate is applied elementwise
// where T is used (and e^{G_i - G_j} with i >= j never exceeds 1). beta's column scale (Delta is
// formed with T diag(beta)) is applied there too, not folded into A: the backward needs T itself
// (dbeta), which A diag(beta) would lose where beta_j = 0. Against the W and U of the WY form
// (docs/design/algorithm.md, forward stage 3) this writes 8 KB of A per (chunk, value head)
// instead of 32 KB and skips the two [64 x 128] products that form them (the walks rebuild Delta
// from A). K K^T on the tensor cores (bf16 operands, fp32 accumulation); the solve by
// substitution and 3xTF32 merges (common/tril_inverse.cuh); A rounded once to bf16. Also writes
// beta in fp32 for the walk (whatever beta's dtype).
//
// ChannelDecay (KDA), the gated inverse, per value head hv of the group:
//
//   G    = cumsum(g) within the chunk, per key channel                 [64 x 128] fp32
//          (its last row out: the walks' state decay)
//   S_ij = sum_c k_ic k_jc e^{G_ic - G_jc}   (i > j; channel_kkt.cuh)  [64 x 64]  fp32
//   A    = T = (I + diag(beta) strict(S))^-1                           [64 x 64]  bf16 out
//
// The per-channel gate cannot be moved out of the product, so A is the gated T itself, and S is
// formed per value head. The same solve, stores and beta as above. With aqk, also the output's
// intra-chunk attention by the same gated product, and the walks' operands:
//
//   P_ij = s sum_c q_ic k_jc e^{G_ic - G_jc}   (i >= j)                 [64 x 64]  bf16 out
//   qg = q o e^G, kg = k o e^G, kbar = k o e^{G_last - G}               [64 x 128] bf16 out
//
// ChannelDecay's CTAs are persistent: two per SM, CTA b taking items b, b + gridDim.x, ... So every
// head's loads (32 KB of g, and 32 KB of K and Q at a new item) run under the solve of the head
// before, not in the open between heads with only the SM's other CTA to cover them: K, Q and G
// are read before the solve, which reads S, beta and its own scratch alone, so they are loaded
// then, the group's next value head's g and beta or, after its last, the next item's K, Q, g and
// beta. Each head's operations and their order are those of one CTA per item, bit for bit.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/decay.hpp"
#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/common/tril_inverse.cuh"
#include "kernels/kkt_solve/channel_kkt.cuh"
#include "kernels/kkt_solve/params.hpp"

namespace cake::kernels::kkt_solve {

inline constexpr int kThreads = kTrilThreads;
inline constexpr int kWarps = kThreads / 32;

template <class Decay>
struct SharedStorage;

// About 38 KB: three CTAs per SM, bound by registers (80 a thread; at four CTAs the kernel gets 64
// and spills). A (fp32) takes K's place once S is formed.
template <>
struct SharedStorage<ScalarDecay> {
  union {
    __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128] keys (zero past the end)
    float t[kChunk * kLd64];            // [64 x 64]  A of the current value head, fp32
  };
  float s[kChunk * kLd64];  // [64 x 64] S = K K^T, shared by the group's value heads
  float y[kTrilScratch];    // the solve's scratch
  float gcum[kChunk];       // G of the current value head
  float beta[kChunk];       // its beta, 0 past the end
};
static_assert(sizeof(SharedStorage<ScalarDecay>) <= 75 * 1024,
              "kkt_solve must fit three CTAs per SM");

// One work item of the per-channel kernel: the chunk c of slot `slot`, for q/k head h.
struct Item {
  ChunkRef c;
  int slot;  // < num_slots = floor(BT / 64) + N + 1
  int h;
};

// The items, numbered as the blocks of a grid of one CTA per item, slots fastest: h num_slots +
// slot.
__host__ __device__ __forceinline__ int64_t num_items(Problem const& pr) {
  return pr.num_slots * pr.num_qk_heads;
}

// About 108 KB: two CTAs per SM. K (and Q) stay for every value head of the group (each forms its
// own S and P).
template <>
struct SharedStorage<ChannelDecay> {
  __nv_bfloat16 k[kChunk * kLdBf16];  // [64 x 128] keys (zero past the end)
  __nv_bfloat16 q[kChunk * kLdBf16];  // [64 x 128] queries, when P is wanted
  float gcum[kChunk * kLdGate];       // [64 x 128] g, then G of the current value head
  float s[kChunk * kLd64];            // [64 x 64]  gated S of the current value head, then its P
  float t[kChunk * kLd64];            // [64 x 64]  its A, fp32; before it, staged row operands
  float y[kTrilScratch];
  float beta[kChunk];
  unsigned far[kHeadDim / 32];  // bit a: diagonal block a out of reach on one of 32 channels
  // the CTA's work item, item[cur], and its next one, item[cur ^ 1] (found before its last
  // head's solve): read where used rather than held in registers (the gated tiles use all 128)
  Item item[2];
};
static_assert(sizeof(SharedStorage<ChannelDecay>::t) >=
                  (kSubBlocks - kStagedFrom) * kStagedWords<2> * sizeof(uint32_t),
              "t holds the staged row operands of row blocks 2 and 3");
static_assert(sizeof(SharedStorage<ChannelDecay>) <= 113 * 1024,
              "kkt_solve with a per-channel gate must fit two CTAs per SM");

template <class Decay>
inline constexpr int kBlocksPerSm = Decay::kGatedKkt ? 2 : 3;

// ChannelDecay's CTAs: as many as are resident on the device at once (persistent), each taking
// the items blockIdx.x, + gridDim.x, ... (fewer when there are fewer items). `resident` is the
// occupancy query's blocks per SM times the SMs: kBlocksPerSm on a whole H100 or H200, fewer
// where less shared memory is left to a CTA, so that no second wave queues. ScalarDecay's grid is
// one CTA per item, (num_slots, H).
inline int64_t channel_decay_ctas(Problem const& pr, int64_t resident) {
  return num_items(pr) < resident ? num_items(pr) : resident;
}

// The first item whose slot holds a chunk from item (slot, h) on (slot may exceed num_slots: it
// carries into h), in steps of gridDim.x items, into it; false when none is left. In 32-bit
// arithmetic (a 64-bit division is a call, and its registers spill in kkt_solve). Every thread of
// a warp calls it with the same item (find_chunk).
__device__ __forceinline__ bool next_item(Problem const& pr, int slot, int h, Item& it) {
  int const num_slots = static_cast<int>(pr.num_slots);
  for (;; slot += gridDim.x) {
    h += slot / num_slots;
    slot %= num_slots;
    if (h >= pr.num_qk_heads) return false;
    it.slot = slot;
    it.h = h;
    if (find_chunk(pr, slot, it.c)) return true;
  }
}

// A lower-triangular [64 x 64] tile (fp32 [64][kLd64] in shared memory, its strictly upper part
// ignored: the solve leaves T's upper 32-block unwritten) -> out [BT, HV, 64] (A or P), rows
// 0..len-1 of chunk c for value head hv, zeros above the diagonal, four columns per thread and
// step (8-byte stores, 128 bytes a row).
__device__ __forceinline__ void store_lower(__nv_bfloat16* out, float const* t, ChunkRef const& c,
                                            int hv, int HV) {
  __nv_bfloat16* const a = out + (c.t0 * HV + hv) * kChunk;
  int64_t const stride = int64_t{HV} * kChunk;
  for (int idx = threadIdx.x; idx < c.len * kChunk / 4; idx += kThreads) {
    int const i = idx / (kChunk / 4);
    int const j = idx % (kChunk / 4) * 4;
    float4 x = *reinterpret_cast<float4 const*>(t + i * kLd64 + j);
    x.x = j > i ? 0.f : x.x;
    x.y = j + 1 > i ? 0.f : x.y;
    x.z = j + 2 > i ? 0.f : x.z;
    x.w = j + 3 > i ? 0.f : x.w;
    __nv_bfloat162 const lo = __floats2bfloat162_rn(x.x, x.y);
    __nv_bfloat162 const hi = __floats2bfloat162_rn(x.z, x.w);
    *reinterpret_cast<uint2*>(a + i * stride + j) = make_uint2(
        *reinterpret_cast<uint32_t const*>(&lo), *reinterpret_cast<uint32_t const*>(&hi));
  }
}

__device__ __forceinline__ void scalar_decay_kkt_solve(Params const& p) {
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage<ScalarDecay>*>(smem_raw);
  ChunkRef c;
  if (!find_chunk(p.problem, blockIdx.x, c)) return;
  int const h = blockIdx.y;
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const group = p.problem.group_size();
  int const len = c.len;
  int const tid = threadIdx.x;

  // Threads 0..63 hold row tid's raw g and beta of the next value head in registers, loaded one
  // value head ahead so that the loads run under the previous head's solve.
  float g_next = 0.f;
  float beta_next = 0.f;
  auto const load_head = [&](int hv) {
    if (tid < len) {
      int64_t const row = (c.t0 + tid) * HV + hv;
      g_next = p.g[row];
      beta_next = load_scalar(p.beta, row, p.beta_is_bf16);
    }
  };
  load_head(h * group);
  load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (c.t0 * H + h) * kHeadDim,
                                              int64_t{H} * kHeadDim, len);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // K visible

  // S = K K^T (its strictly lower part is read)
  block_gemm<kChunk, kChunk, kHeadDim, 1, 2, kWarps>(
      RowMajor{s.k, kLdBf16}, ColMajor{s.k, kLdBf16}, [&](int i, int j, float c0, float c1) {
        *reinterpret_cast<float2*>(s.s + i * kLd64 + j) = make_float2(c0, c1);
      });

  for (int hv = h * group; hv < (h + 1) * group; ++hv) {
    if (tid < kChunk) {
      s.gcum[tid] = g_next;
      s.beta[tid] = beta_next;
    }
    if (hv + 1 < (h + 1) * group) load_head(hv + 1);
    // S, this head's g and beta visible; the previous head's A written out (t free)
    __syncthreads();
    warp_cumsum64(s.gcum);  // G, read after the solve's barriers
    invert_unit_lower_64(s.s, s.beta, s.t, s.y);
    if (tid < len) {
      p.gcum[(c.t0 + tid) * HV + hv] = s.gcum[tid];
      if (p.beta_f32 != nullptr) p.beta_f32[(c.t0 + tid) * HV + hv] = s.beta[tid];
    }

    store_lower(p.a, s.t, c, hv, HV);
  }
}

// The walks' operands of one chunk and value head, rows 0..len-1: qg = q o e^G, kg = k o e^G,
// kbar = k o e^{G_last - G}, each factor one exponential of a difference <= 0 (never e^{G_last} /
// e^{G}: that overflows). Per thread and step two groups of four channels, c and c + 64, so that
// the index and address arithmetic serves eight; per group 8-byte loads and stores, a half-warp's
// 128 contiguous bytes of a row (16-byte accesses of eight adjacent channels would meet 2-way bank
// conflicts in G's rows). q, k: bf16 [64][kLdBf16] tiles, G: fp32 [64][kLdGate]; row0 = t0 HV +
// hv. By the threads from `first` on.
__device__ __forceinline__ void store_walk_operands(Params const& p, __nv_bfloat16 const* q,
                                                    __nv_bfloat16 const* k, float const* G,
                                                    int64_t row0, int HV, int len, int first) {
  constexpr int kVec = 4;
  float const* const g_last = G + (len - 1) * kLdGate;
  int const t = static_cast<int>(threadIdx.x) - first;
  if (t < 0) return;
  auto const load4 = [](__nv_bfloat16 const* at, float(&v)[kVec]) {
    uint2 const raw = *reinterpret_cast<uint2 const*>(at);
    float2 const lo = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(&raw.x));
    float2 const hi = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 const*>(&raw.y));
    v[0] = lo.x;
    v[1] = lo.y;
    v[2] = hi.x;
    v[3] = hi.y;
  };
  auto const store4 = [](__nv_bfloat16* at, float const(&v)[kVec]) {
    *reinterpret_cast<uint2*>(at) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
  };
  constexpr int kHalf = kHeadDim / 2;
  for (int idx = t; idx < len * (kHalf / kVec); idx += kThreads - first) {
    int const r = idx / (kHalf / kVec);
    int const c0 = idx % (kHalf / kVec) * kVec;
    int64_t const at0 = (row0 + int64_t{r} * HV) * kHeadDim + c0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int const c = c0 + kHalf * half;
      int64_t const at = at0 + kHalf * half;
      float4 const gr4 = *reinterpret_cast<float4 const*>(G + r * kLdGate + c);
      float const gr[kVec] = {gr4.x, gr4.y, gr4.z, gr4.w};
      float kr[kVec], e[kVec], out[kVec];
      load4(k + r * kLdBf16 + c, kr);
#pragma unroll
      for (int v = 0; v < kVec; ++v) e[v] = __expf(gr[v]);
      if (p.qg != nullptr) {
        float qr[kVec];
        load4(q + r * kLdBf16 + c, qr);
#pragma unroll
        for (int v = 0; v < kVec; ++v) out[v] = qr[v] * e[v];
        store4(p.qg + at, out);
      }
      if (p.kg != nullptr) {
#pragma unroll
        for (int v = 0; v < kVec; ++v) out[v] = kr[v] * e[v];
        store4(p.kg + at, out);
      }
      if (p.kbar != nullptr) {
        float4 const gl4 = *reinterpret_cast<float4 const*>(g_last + c);
        float const gl[kVec] = {gl4.x, gl4.y, gl4.z, gl4.w};
#pragma unroll
        for (int v = 0; v < kVec; ++v) out[v] = kr[v] * __expf(gl[v] - gr[v]);
        store4(p.kbar + at, out);
      }
    }
  }
}

__device__ __forceinline__ void channel_decay_kkt_solve(Params const& p) {
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage<ChannelDecay>*>(smem_raw);
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const group = p.problem.group_size();
  int const tid = threadIdx.x;
  bool const reads_q = p.aqk != nullptr || p.qg != nullptr;  // P, or qg
  bool const solves = p.a != nullptr;

  // The loads of value head hv of item it, issued one head ahead (under the previous head's
  // solve): K (and Q) when the item changes, and g [64 x 128] (zero past the end, so G stays flat
  // there), by cp.async; threads 0..63 hold row tid's beta in beta_next (0 past the end) until the
  // head starts.
  float beta_next = 0.f;
  auto const load_head = [&](Item const& it, int hv, bool new_item) {
    int64_t const row0 = it.c.t0 * HV + hv;
    if (new_item) {
      int64_t const qk = (it.c.t0 * H + it.h) * kHeadDim;
      load_tile_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + qk, int64_t{H} * kHeadDim,
                                                  it.c.len);
      if (reads_q)
        load_tile_async<kChunk, kHeadDim, kThreads>(s.q, kLdBf16, p.q + qk, int64_t{H} * kHeadDim,
                                                    it.c.len);
    }
    load_tile_async<kChunk, kHeadDim, kThreads>(s.gcum, kLdGate, p.g + row0 * kHeadDim,
                                                int64_t{HV} * kHeadDim, it.c.len);
    cp_async_commit();
    if (tid < kChunk)
      beta_next =
          tid < it.c.len ? load_scalar(p.beta, row0 + int64_t{tid} * HV, p.beta_is_bf16) : 0.f;
  };

  int cur = 0;
  int hv;
  {
    Item first;
    if (!next_item(p.problem, blockIdx.x, 0, first)) return;
    if (tid == 0) s.item[0] = first;
    hv = first.h * group;
    load_head(first, hv, true);
  }
  for (;;) {
    Item const& it = s.item[cur];
    // the previous head's solve read beta before its last barrier (its beta_f32 store: this thread)
    if (tid < kChunk) s.beta[tid] = beta_next;
    cp_async_wait<0>();
    __syncthreads();  // K, g and beta visible

    // G: thread c < 128 runs down channel c, and tests each diagonal block's reach on its channel
    // as it goes (channel_within_reach, formed once for the CTA)
    if (tid < kHeadDim) {
      float acc = 0.f;
      unsigned far = 0u;
#pragma unroll
      for (int a = 0; a < kSubBlocks; ++a) {
        float g[kSubBlock];
#pragma unroll
        for (int r = 0; r < kSubBlock; ++r) {
          float* const at = s.gcum + (a * kSubBlock + r) * kLdGate + tid;
          acc += *at;
          *at = acc;
          g[r] = acc;
        }
        far |= channel_within_reach(g) ? 0u : 1u << a;
      }
#pragma unroll
      for (int a = 0; a < kSubBlocks; ++a)
        if (__ballot_sync(0xffffffffu, far >> a & 1u) != 0u) far |= 1u << a;
      if (tid % 32 == 0) s.far[tid / 32] = far;
    }
    __syncthreads();  // G and the reach votes visible
    int const len = it.c.len;
    int64_t const row0 = it.c.t0 * HV + hv;

    // S (into shared memory, for the solve) and P (bf16, straight to aqk): block (a, b) of both on
    // one warp (gated_tiles: their shared operand and factors formed once), the 10 blocks over the
    // warps, then the walk operands on the warps with one block fewer. Without a (the backward of
    // inverse mode, whose saved set holds A, P, beta and G's last rows) only the walks' operands:
    // no gated product, no solve.
    unsigned far = 0u;
    for (unsigned const votes : s.far) far |= votes;
    unsigned const tensor_cores = kAllDiagonalBlocks & ~far;
    int const tasks = solves ? kTileTasks : 0;
    float const scale = p.problem.scale;
    int64_t const p_stride = int64_t{HV} * kChunk;  // aqk [BT, HV, 64]
    __nv_bfloat16* const aqk = solves ? p.aqk + row0 * kChunk : nullptr;
    auto const put_s = [&](int a, int b, float const(&acc)[2][4]) {
      put_tile(acc, a, b, [&](int i, int j, float v0, float v1) {
        if (a != b || j < i) s.s[i * kLd64 + j] = v0;
        if (a != b || j + 1 < i) s.s[i * kLd64 + j + 1] = v1;
      });
    };
    // row blocks 2 and 3's row operands (off the diagonal), 16 channel steps over the warps, in
    // t's room (the solve writes t after the gated tiles)
    uint32_t* const staged = reinterpret_cast<uint32_t*>(s.t);
    if (solves) {
      for (int unit = tid / 32; unit < (kSubBlocks - kStagedFrom) * kHeadDim / 16; unit += kWarps)
        stage_rows<2>({s.k, s.q}, s.gcum, kStagedFrom + unit / (kHeadDim / 16),
                      unit % (kHeadDim / 16), staged + unit / (kHeadDim / 16) * kStagedWords<2>);
      __syncthreads();  // the staged row operands visible
    }
    for (int task = tid / 32; task < tasks; task += kWarps) {
      int a, b;
      tile_blocks(task, a, b);
      if (a == b && !(tensor_cores >> a & 1u)) continue;
      float acc[2][2][4] = {};  // [S, P][ni][m16n8 accumulator]
      if (a > b && a >= kStagedFrom)
        gated_tiles<2, true>({s.k, s.q}, s.k, s.gcum, a, b, acc,
                             staged + (a - kStagedFrom) * kStagedWords<2>);
      else
        gated_tiles<2>({s.k, s.q}, s.k, s.gcum, a, b, acc);
      put_s(a, b, acc[0]);
      // rows past the end unwritten; zeros above the diagonal, as store_lower writes them
      put_tile(acc[1], a, b, [&](int i, int j, float v0, float v1) {
        if (i < len)
          *reinterpret_cast<__nv_bfloat162*>(aqk + i * p_stride + j) =
              __floats2bfloat162_rn(j <= i ? scale * v0 : 0.f, j + 1 <= i ? scale * v1 : 0.f);
      });
    }
    if (p.qg != nullptr || p.kg != nullptr || p.kbar != nullptr) {
      int const light = tasks % kWarps;  // warps light.. take one block fewer (none when 0)
      store_walk_operands(p, s.q, s.k, s.gcum, row0, HV, len, 32 * light);
    }
    if (solves) {
      gated_pairs<kWarps, false>(s.k, s.k, s.gcum, tensor_cores,
                                 [&](int i, int j, float v) { s.s[i * kLd64 + j] = v; });
      gated_pairs<kWarps, true>(s.q, s.k, s.gcum, tensor_cores, [&](int i, int j, float v) {
        if (i < len) aqk[i * p_stride + j] = __float2bfloat16(scale * v);
      });
      // P's zeros above the diagonal: the blocks right of it (16-byte stores), and the upper part
      // of a diagonal block formed pair by pair (a tensor-core diagonal block wrote its own)
      constexpr int kPerStore = 8;  // bf16 in 16 bytes
      for (int idx = tid; idx < len * (kChunk / kPerStore); idx += kThreads) {
        int const i = idx / (kChunk / kPerStore);
        int const j = idx % (kChunk / kPerStore) * kPerStore;
        int const a = i / kSubBlock;
        int const b = j / kSubBlock;
        __nv_bfloat16* const at = aqk + i * p_stride + j;
        if (b > a) {
          *reinterpret_cast<uint4*>(at) = make_uint4(0u, 0u, 0u, 0u);
        } else if (a == b && !(tensor_cores >> a & 1u)) {
          for (int v = 0; v < kPerStore; ++v)
            if (j + v > i) at[v] = __float2bfloat16(0.f);
        }
      }
    }
    if (p.glast != nullptr && tid < kHeadDim / 4)  // G's last row -> glast[slot, hv]
      *reinterpret_cast<float4*>(p.glast + (int64_t{it.slot} * HV + hv) * kHeadDim + 4 * tid) =
          *reinterpret_cast<float4 const*>(s.gcum + (len - 1) * kLdGate + 4 * tid);
    __syncthreads();  // S visible; K, Q and G read: the next head's loads may overwrite them
    int const this_cur = cur;
    int const this_hv = hv;
    bool more = true;
    if (hv + 1 < (it.h + 1) * group) {
      load_head(it, ++hv, false);
    } else if (Item next; next_item(p.problem, it.slot + gridDim.x, it.h, next)) {
      // the CTA's next item (find_chunk reads cu_seqlens, which the CTA has read before); no
      // thread reads item[cur ^ 1] before the next head's first barrier
      if (tid == 0) s.item[cur ^ 1] = next;
      cur ^= 1;
      hv = next.h * group;
      load_head(next, hv, true);
    } else {
      more = false;
    }
    if (solves) {
      ChunkRef const& c = s.item[this_cur].c;
      invert_unit_lower_64(s.s, s.beta, s.t, s.y);
      if (tid < c.len && p.beta_f32 != nullptr)
        p.beta_f32[c.t0 * HV + this_hv + int64_t{tid} * HV] = s.beta[tid];
      store_lower(p.a, s.t, c, this_hv, HV);
    }
    if (!more) return;
  }
}

template <class Decay>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<Decay>)
    kkt_solve_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (Decay::kGatedKkt)
    channel_decay_kkt_solve(p);
  else
    scalar_decay_kkt_solve(p);
#endif
}

}  // namespace cake::kernels::kkt_solve
