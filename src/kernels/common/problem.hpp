// The shape of one GDN problem as every kernel sees it, and the chunk bookkeeping of packed
// variable-length documents, shared by host (launch sizes) and device (work lookup).
//
// Chunks of kChunk = 64 tokens restart at every document start. Chunk j of document n lives in
// "slot" slot_base(n) + j with slot_base(n) = floor(cu[n] / 64) + n: strictly increasing in n and
// never overlapping (ceil(len / 64) <= floor(cu[n+1] / 64) - floor(cu[n] / 64) + 1), so per-chunk
// buffers and chunk-parallel grids are sized by num_slots = floor(BT / 64) + N + 1 without reading
// cu_seqlens on the host. A CTA finds its document by binary search over the device cu_seqlens;
// the few slots that belong to no chunk exit at once.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CAKE_HD __host__ __device__ __forceinline__
#else
#define CAKE_HD inline
#endif

namespace cake::kernels {

inline constexpr int kChunk = 64;   // C: tokens per chunk
inline constexpr int kHeadDim = 128;  // K = V: the one head size built

struct Problem {
  int64_t num_tokens = 0;            // BT: B * T, all documents packed token-major
  int64_t seq_len = 0;               // T: document length when cu_seqlens is absent
  int32_t num_seqs = 0;              // N
  int32_t num_qk_heads = 0;          // H
  int32_t num_v_heads = 0;           // HV, a multiple of H
  int64_t num_slots = 0;             // floor(BT / 64) + N + 1
  int32_t const* cu_seqlens32 = nullptr;  // [N + 1] on the device, or nullptr
  int64_t const* cu_seqlens64 = nullptr;  // [N + 1] on the device, or nullptr
  float scale = 1.f;

  CAKE_HD int64_t seq_begin(int64_t n) const {
    if (cu_seqlens32 != nullptr) return cu_seqlens32[n];
    if (cu_seqlens64 != nullptr) return cu_seqlens64[n];
    return n * seq_len;
  }
  CAKE_HD int64_t slot_base(int64_t n) const { return seq_begin(n) / kChunk + n; }
  CAKE_HD int32_t group_size() const { return num_v_heads / num_qk_heads; }
};

// One chunk: document n, tokens [t0, t0 + len) with 1 <= len <= 64, chunk index j in the document.
struct ChunkRef {
  int64_t t0;
  int32_t len;
  int32_t n;
  int32_t j;
  int32_t num_chunks;  // of document n
};

// The chunk held in slot `slot`, or false when the slot belongs to no chunk.
CAKE_HD bool find_chunk(Problem const& p, int64_t slot, ChunkRef& c) {
  int32_t lo = 0;
  int32_t hi = p.num_seqs - 1;
  if (hi < 0 || p.slot_base(0) > slot) return false;
  while (lo < hi) {  // largest n with slot_base(n) <= slot
    int32_t const mid = (lo + hi + 1) / 2;
    if (p.slot_base(mid) <= slot) lo = mid; else hi = mid - 1;
  }
  int64_t const begin = p.seq_begin(lo);
  int64_t const len = p.seq_begin(lo + 1) - begin;
  int64_t const j = slot - p.slot_base(lo);
  if (j * kChunk >= len) return false;
  c.n = lo;
  c.j = static_cast<int32_t>(j);
  c.t0 = begin + j * kChunk;
  c.len = static_cast<int32_t>(len - j * kChunk < kChunk ? len - j * kChunk : kChunk);
  c.num_chunks = static_cast<int32_t>((len + kChunk - 1) / kChunk);
  return true;
}

}  // namespace cake::kernels
