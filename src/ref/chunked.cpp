// The chunked algorithm in FP64: the GPU's stages in order, each a full pass over all chunks
// that hands the next one dense arrays, as the kernels hand each other global memory
// (chunked.hpp; the maths in docs/design/algorithm.md).
//
//   forward:  1 cumsum G | 2 solve A = T | 3 w, u | 4 state walk h, v_new, ht | 5 output o
//   backward: 1-4 again (recompute) | 5' dv_new_intra | 4' reverse walk dh, dv_new, dh0 |
//             6 dq, dk, dw, dG | 7 WY: dk, dv, dbeta, dG | 8 reverse cumsum dg, GVA sums dq, dk
#include "ref/chunked.hpp"

#include <vector>

#include "core/error.hpp"
#include "ref/chunk_cumsum.hpp"
#include "ref/chunk_dqkw.hpp"
#include "ref/chunk_layout.hpp"
#include "ref/chunk_output.hpp"
#include "ref/chunk_solve.hpp"
#include "ref/chunk_state.hpp"
#include "ref/chunk_wy.hpp"
#include "ref/chunk_wy_bwd.hpp"

namespace cake::ref {
namespace {

// What forward stages 1-4 leave for the output (stage 5) and for the backward.
struct ForwardIntermediates {
  std::vector<double> G;      // [T, HV] or [T, HV, K]: chunk-local cumsum of g
  std::vector<double> A;      // [T, HV, C]: T = (I + L)^-1, row t = row of its chunk
  std::vector<double> w;      // [T, HV, K]
  std::vector<double> u;      // [T, HV, V]
  std::vector<double> h;      // [NT, HV, K, V]: state at the start of every chunk
  std::vector<double> v_new;  // [T, HV, V]: Delta = U - W h
};

ForwardIntermediates forward_stages(Shape const& shape, ChunkTiling const& tiling, Inputs const& in,
                                    double* ht) {
  Layout const ix(shape, tiling.chunk_size);
  int64_t const T = shape.num_tokens;
  ForwardIntermediates f;
  f.G.resize(T * ix.HV * ix.gate_width);
  f.A.resize(T * ix.HV * ix.C);
  f.w.resize(T * ix.HV * ix.K);
  f.u.resize(T * ix.HV * ix.V);
  f.h.resize(tiling.num_chunks() * ix.HV * ix.state_size());
  f.v_new.resize(T * ix.HV * ix.V);
  chunk_local_cumsum(shape, tiling, in.g, f.G.data());
  chunk_solve_forward(shape, tiling, in.k, in.beta, f.G.data(), f.A.data());
  chunk_wy_forward(shape, tiling, in.k, in.v, in.beta, f.G.data(), f.A.data(), f.w.data(),
                   f.u.data());
  chunk_state_forward(shape, tiling, in.k, f.G.data(), f.w.data(), f.u.data(), in.h0, f.h.data(),
                      f.v_new.data(), ht);
  return f;
}

// dq/dk of q/k head h = sum over its value heads hv = h G .. h G + G - 1, in ascending order, so
// the result does not depend on how the per-value-head work was scheduled.
void sum_value_heads(Shape const& shape, std::vector<double> const& per_v_head, double* out) {
  int64_t const H = shape.num_qk_heads, K = shape.head_dim_k, group = shape.group_size();
  parallel_for(shape.num_tokens, [&](int64_t t) {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < K; ++d) {
        double sum = 0;
        for (int64_t hv = h * group; hv < (h + 1) * group; ++hv)
          sum += per_v_head[(t * shape.num_v_heads + hv) * K + d];
        out[(t * H + h) * K + d] = sum;
      }
  });
}

}  // namespace

void chunked_forward(Shape const& shape, Inputs const& in, Outputs const& out, int chunk_size) {
  CAKE_CHECK(chunk_size >= 1, cakeInvalidArgument, "chunk_size must be >= 1, got ", chunk_size);
  ChunkTiling const tiling(shape, chunk_size);
  ForwardIntermediates const f = forward_stages(shape, tiling, in, out.ht);
  chunk_output_forward(shape, tiling, in.scale, in.q, in.k, f.G.data(), f.h.data(), f.v_new.data(),
                       out.o);
}

void chunked_backward(Shape const& shape, Inputs const& in, OutputGrads const& grad_out,
                      InputGrads const& grad_in, int chunk_size) {
  CAKE_CHECK(chunk_size >= 1, cakeInvalidArgument, "chunk_size must be >= 1, got ", chunk_size);
  ChunkTiling const tiling(shape, chunk_size);
  Layout const ix(shape, chunk_size);
  int64_t const T = shape.num_tokens;
  ForwardIntermediates const f = forward_stages(shape, tiling, in, nullptr);

  std::vector<double> dv_new_intra(T * ix.HV * ix.V);
  chunk_output_backward_dv(shape, tiling, in.scale, in.q, in.k, f.G.data(), grad_out.d_o,
                           dv_new_intra.data());

  std::vector<double> dh(tiling.num_chunks() * ix.HV * ix.state_size());
  std::vector<double> dv_new(T * ix.HV * ix.V);
  chunk_state_backward(shape, tiling, in.scale, in.q, in.k, f.G.data(), f.w.data(), grad_out.d_o,
                       dv_new_intra.data(), grad_out.dht, dh.data(), dv_new.data(), grad_in.dh0);

  std::vector<double> dq(T * ix.HV * ix.K), dk(T * ix.HV * ix.K), dw(T * ix.HV * ix.K);
  std::vector<double> dG(T * ix.HV * ix.gate_width);
  chunk_dqkw(shape, tiling, in.scale, in.q, in.k, f.G.data(), f.h.data(), f.v_new.data(),
             grad_out.d_o, dh.data(), dv_new.data(), dq.data(), dk.data(), dw.data(), dG.data());
  chunk_wy_backward(shape, tiling, in.k, in.v, in.beta, f.G.data(), f.A.data(), dw.data(),
                    dv_new.data(), dk.data(), grad_in.dv, grad_in.dbeta, dG.data());

  chunk_local_reverse_cumsum(shape, tiling, dG.data(), grad_in.dg);
  sum_value_heads(shape, dq, grad_in.dq);
  sum_value_heads(shape, dk, grad_in.dk);
}

}  // namespace cake::ref
