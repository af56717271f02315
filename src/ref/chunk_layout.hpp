// How the chunked reference cuts the packed tokens into chunks, and where each stage finds a row.
//
// Document n holds tokens [cu[n], cu[n+1]) and is cut into ceil(len / C) chunks of C tokens, the
// last one partial; chunks never straddle documents. Chunks are numbered globally in document
// order (FLA's chunk_offsets), which is the slot of a chunk's state in h [NT, HV, K, V].
//
// Every stage runs one work item per (document, value head) and walks that document's chunks
// in order, like the GPU's chunk-parallel grids (NT, HV) and sequential grids (N, HV). Items
// write disjoint memory, so results do not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ref/parallel.hpp"
#include "ref/problem.hpp"

namespace cake::ref {

// Row offsets into the dense token-major arrays of problem.hpp and of the chunked intermediates.
struct Layout {
  int64_t H, HV, K, V;
  int64_t gate_width;   // 1 (GDN) or K (KDA)
  int64_t gate_stride;  // 0 (GDN: one gate for every key channel) or 1 (KDA)
  int64_t C;            // chunk size

  Layout(Shape const& shape, int64_t chunk_size)
      : H(shape.num_qk_heads),
        HV(shape.num_v_heads),
        K(shape.head_dim_k),
        V(shape.head_dim_v),
        gate_width(shape.gate_width()),
        gate_stride(shape.gate == Gate::kScalar ? 0 : 1),
        C(chunk_size) {}

  int64_t qk(int64_t t, int64_t h) const { return (t * H + h) * K; }      // q, k: [T, H, K]
  int64_t key(int64_t t, int64_t hv) const { return (t * HV + hv) * K; }  // w, dq, dw: [T, HV, K]
  int64_t val(int64_t t, int64_t hv) const { return (t * HV + hv) * V; }  // v, u, o: [T, HV, V]
  int64_t gate(int64_t t, int64_t hv) const { return (t * HV + hv) * gate_width; }  // g, G
  int64_t head(int64_t t, int64_t hv) const { return t * HV + hv; }                 // beta
  int64_t row(int64_t t, int64_t hv) const { return (t * HV + hv) * C; }            // A: [T, HV, C]
  int64_t state(int64_t slot, int64_t hv) const { return (slot * HV + hv) * K * V; }
  int64_t state_size() const { return K * V; }
};

// One chunk of one value head. Row r of the chunk is token begin + r, r in [0, size).
struct Chunk {
  int64_t seq;    // document n
  int64_t slot;   // global chunk index: where h and dh of this chunk live
  int64_t begin;  // first token
  int64_t size;   // rows: C, or fewer in a document's last chunk
  int64_t hv;     // value head
  int64_t h;      // its q/k head, hv / (HV / H)
  int64_t last() const { return begin + size - 1; }
};

// The chunk table of a packed batch: chunk_offsets[n] is the first global chunk of document n.
struct ChunkTiling {
  int64_t chunk_size = 0;
  std::vector<int64_t> cu_seqlens;     // [N + 1]
  std::vector<int64_t> chunk_offsets;  // [N + 1]

  ChunkTiling(Shape const& shape, int size) : chunk_size(size), cu_seqlens(shape.cu_seqlens) {
    chunk_offsets.push_back(0);
    for (int64_t n = 0; n + 1 < static_cast<int64_t>(cu_seqlens.size()); ++n) {
      int64_t const len = cu_seqlens[n + 1] - cu_seqlens[n];
      chunk_offsets.push_back(chunk_offsets.back() + (len + chunk_size - 1) / chunk_size);
    }
  }
  int64_t num_seqs() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
  int64_t num_chunks() const { return chunk_offsets.back(); }
  int64_t num_chunks(int64_t n) const { return chunk_offsets[n + 1] - chunk_offsets[n]; }

  // Chunk c (in [0, num_chunks(n))) of document n for value head hv.
  Chunk chunk(int64_t n, int64_t c, int64_t hv, int64_t group_size) const {
    int64_t const begin = cu_seqlens[n] + c * chunk_size;
    int64_t const size = std::min(chunk_size, cu_seqlens[n + 1] - begin);
    return {n, chunk_offsets[n] + c, begin, size, hv, hv / group_size};
  }
};

// Runs f(n, hv) for every (document, value head) pair on the machine's cores.
template <class F>
void for_each_seq_head(ChunkTiling const& tiling, int64_t num_v_heads, F const& f) {
  parallel_for(tiling.num_seqs() * num_v_heads,
               [&](int64_t item) { f(item / num_v_heads, item % num_v_heads); });
}

// Runs f(chunk) for every chunk of every (document, value head), chunks of a document in order.
template <class F>
void for_each_chunk(Shape const& shape, ChunkTiling const& tiling, F const& f) {
  for_each_seq_head(tiling, shape.num_v_heads, [&](int64_t n, int64_t hv) {
    for (int64_t c = 0; c < tiling.num_chunks(n); ++c)
      f(tiling.chunk(n, c, hv, shape.group_size()));
  });
}

// The decay factors of the chunk maths, read channel by channel from the chunk-local cumsum G
// (G_i points at token i's gate row; channel d is G_i[d * gate_stride]).
//   e_i = e^{G_i}     ebar_i = e^{G_last - G_i}     Gamma_ij = e^{G_i - G_j}
// Each is one exp of a difference, never a product of two exps: with g = -20 per token e^{-G}
// overflows double within a chunk of 64, while every difference used here is <= 0 for i >= j.
inline double decay_pair(double const* G_i, double const* G_j, int64_t d, int64_t gate_stride) {
  return std::exp(G_i[d * gate_stride] - G_j[d * gate_stride]);
}

// Adds the gate gradient of chunk c, kept per key channel in dG_ch [size, K], onto dG at the
// gate's width: channel by channel for KDA, summed over the channels for GDN.
inline void add_gate_grad(Layout const& ix, Chunk const& c, std::vector<double> const& dG_ch,
                          double* dG) {
  for (int64_t i = 0; i < c.size; ++i) {
    double* dG_i = dG + ix.gate(c.begin + i, c.hv);
    for (int64_t d = 0; d < ix.K; ++d) dG_i[d * ix.gate_stride] += dG_ch[i * ix.K + d];
  }
}

}  // namespace cake::ref
