// Stage 1 (forward) and the last stage (backward): chunk-local cumsums of the gate.
//
//   forward   G_r  = sum_{t <= r} g_t      inclusive, restarting at every chunk and document
//   backward  dg_t = sum_{r >= t} dG_r     its adjoint: reverse inclusive cumsum, same restarts
//
// Arrays are [T, HV] (GDN) or [T, HV, K] (KDA), one cumsum per gate channel. No log2 scaling:
// the reference keeps natural logs and calls exp.
#pragma once

#include "ref/chunk_layout.hpp"

namespace cake::ref {

void chunk_local_cumsum(Shape const& shape, ChunkTiling const& tiling, double const* g, double* G);

void chunk_local_reverse_cumsum(Shape const& shape, ChunkTiling const& tiling, double const* dG,
                                double* dg);

}  // namespace cake::ref
