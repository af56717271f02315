// Stage 4: the sequential walks over a document's chunks, forward and reverse ("fwd_h",
// "bwd_dhu"). These are the only stages that carry data from chunk to chunk; the GPU runs them
// with one CTA row per (document, value head) and the state in registers.
//
// Per chunk with start state h (K x V), e_i = e^{G_i}, ebar_i = e^{G_last - G_i},
// gamma = e^{G_last} (scalars for GDN, K-vectors applied to the rows of h for KDA):
//
// forward, h = h0 (or 0) at a document's first chunk:
//   store h                                          h     [NT, HV, K, V]
//   Delta_i = u_i - h^T w_i                          v_new [T, HV, V]   (the recurrence's delta, has beta)
//   h <- gamma * h + sum_i (k_i * ebar_i) Delta_i^T  (the next chunk's start state; ht at the end)
//
// backward, dS = dht (or 0) at a document's last chunk, chunks in reverse:
//   store dS (the gradient of this chunk's END state)           dh [NT, HV, K, V]
//   dDelta_i = dDelta_intra_i + dS^T (k_i * ebar_i)             dv_new [T, HV, V]
//   dS <- gamma * dS + scale sum_i (q_i * e_i) dO_i^T - sum_i w_i dDelta_i^T
// and dS after the first chunk is dh0. dDelta_intra = Aqk^T dO comes from stage 5's backward.
#pragma once

#include "ref/chunk_layout.hpp"

namespace cake::ref {

void chunk_state_forward(Shape const& shape, ChunkTiling const& tiling,
                         double const* k,   // [T, H, K]
                         double const* G,   // [T, HV] or [T, HV, K]
                         double const* w,   // [T, HV, K]
                         double const* u,   // [T, HV, V]
                         double const* h0,  // [N, HV, K, V] or nullptr (zero)
                         double* h,         // [NT, HV, K, V]
                         double* v_new,     // [T, HV, V]
                         double* ht);       // [N, HV, K, V] or nullptr (not wanted)

void chunk_state_backward(Shape const& shape, ChunkTiling const& tiling, double scale,
                          double const* q,             // [T, H, K]
                          double const* k,             // [T, H, K]
                          double const* G,             // [T, HV] or [T, HV, K]
                          double const* w,             // [T, HV, K]
                          double const* d_o,           // [T, HV, V]
                          double const* dv_new_intra,  // [T, HV, V]
                          double const* dht,           // [N, HV, K, V] or nullptr (zero)
                          double* dh,                  // [NT, HV, K, V]
                          double* dv_new,              // [T, HV, V]
                          double* dh0);                // [N, HV, K, V] or nullptr (not wanted)

}  // namespace cake::ref
