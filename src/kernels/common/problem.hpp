// The shape of one GDN problem as every kernel sees it, and the chunk bookkeeping of packed
// variable-length documents, shared by host (launch sizes) and device (work lookup).
//
// Chunks of kChunk = 64 tokens restart at every document start. Chunk j of document n lives in
// "slot" slot_base(n) + j with slot_base(n) = floor(cu[n] / 64) + n: strictly increasing in n and
// never overlapping (ceil(len / 64) <= floor(cu[n+1] / 64) - floor(cu[n] / 64) + 1), so per-chunk
// buffers and chunk-parallel grids are sized by num_slots = floor(BT / 64) + N + 1 without reading
// cu_seqlens on the host. A CTA finds its document from the device cu_seqlens (one round of
// loads per warp for fewer than 32 documents, else a binary search); the few slots that belong to
// no chunk exit at once.
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

// Chunk slots of BT tokens packed as N documents: every chunk of every document has its own.
constexpr int64_t slots_for(int64_t num_tokens, int64_t num_seqs) {
  return num_tokens / kChunk + num_seqs + 1;
}

struct Problem {
  int64_t num_tokens = 0;            // BT: B * T, all documents packed token-major
  int64_t seq_len = 0;               // T: document length when cu_seqlens is absent
  int32_t num_seqs = 0;              // N
  int32_t num_qk_heads = 0;          // H
  int32_t num_v_heads = 0;           // HV, a multiple of H
  int64_t num_slots = 0;             // slots_for(BT, N)
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
  // Elements of a [K, V] state in every chunk slot and value head (h, and the split reverse
  // walk's dS of each chunk's end).
  CAKE_HD int64_t chunk_state_elements() const {
    return num_slots * num_v_heads * kHeadDim * kHeadDim;
  }
};

// One chunk: document n, tokens [t0, t0 + len) with 1 <= len <= 64, chunk index j in the document.
struct ChunkRef {
  int64_t t0;
  int32_t len;
  int32_t n;
  int32_t j;
  int32_t num_chunks;  // of document n
};

// The chunk of slot `slot` when it lies in document n = [begin, end), or false when the slot is
// past the document's last chunk.
CAKE_HD bool chunk_in_document(int32_t n, int64_t begin, int64_t end, int64_t slot, ChunkRef& c) {
  int64_t const len = end - begin;
  int64_t const j = slot - (begin / kChunk + n);
  if (j * kChunk >= len) return false;
  c.n = n;
  c.j = static_cast<int32_t>(j);
  c.t0 = begin + j * kChunk;
  c.len = static_cast<int32_t>(len - j * kChunk < kChunk ? len - j * kChunk : kChunk);
  c.num_chunks = static_cast<int32_t>((len + kChunk - 1) / kChunk);
  return true;
}

#if defined(__CUDA_ARCH__)
// find_chunk on the device for fewer than 32 documents: lane i reads document i's start (lanes
// 0..N, all at once), and the warp's ballot of slot_base(i) <= slot gives the document (slot_base
// increases with n, so the lanes that pass are a prefix). One round of loads where the binary
// search waits for log2(N) + 2 dependent ones (~2 us at the start of every CTA of the chunk
// kernels; Nsight put 12 % of one such kernel's stall samples there). Every lane of the warp calls
// it with the same slot.
__device__ __forceinline__ bool find_chunk_in_warp(Problem const& p, int64_t slot, ChunkRef& c) {
  int const lane = threadIdx.x % 32;
  int32_t const N = p.num_seqs;
  int64_t const begin = lane <= N ? p.seq_begin(lane) : 0;
  unsigned const hit = __ballot_sync(0xffffffffu, lane < N && begin / kChunk + lane <= slot);
  if (hit == 0) return false;
  int const n = 31 - __clz(hit);
  int64_t const doc_begin = __shfl_sync(0xffffffffu, begin, n);
  int64_t const doc_end = __shfl_sync(0xffffffffu, begin, n + 1);
  return chunk_in_document(n, doc_begin, doc_end, slot, c);
}
#endif

// The chunk held in slot `slot`, or false when the slot belongs to no chunk. On the device every
// thread of the warp must call it (with the same slot).
CAKE_HD bool find_chunk(Problem const& p, int64_t slot, ChunkRef& c) {
#if defined(__CUDA_ARCH__)
  if (p.num_seqs < 32) return find_chunk_in_warp(p, slot, c);
#endif
  int32_t lo = 0;
  int32_t hi = p.num_seqs - 1;
  if (hi < 0 || p.slot_base(0) > slot) return false;
  while (lo < hi) {  // largest n with slot_base(n) <= slot
    int32_t const mid = (lo + hi + 1) / 2;
    if (p.slot_base(mid) <= slot) lo = mid; else hi = mid - 1;
  }
  return chunk_in_document(lo, p.seq_begin(lo), p.seq_begin(lo + 1), slot, c);
}

}  // namespace cake::kernels
