// An FP64 model of the GDN backward of the CUDA kernels (docs/design/gdn-hopper-fused-walks.md,
// step 4): an h-walk, then ONE reverse walk per (document, value head) that forms every gradient
// of a chunk from that chunk's inputs, its start state h, the un-gated inverse A and the gradient
// dS of its end state. No W, U, T, Delta, dDelta or dS leaves the step (the GPU kernel keeps them
// on chip). It is the specification that the CUDA kernel (walk_a_bwd) follows, product by
// product; the test (tests/cpp/test_gdn_walk_model.cpp) holds it to the stage-by-stage reference
// (ref/chunked.hpp).
//
// Per chunk (C tokens; G = within-chunk cumsum of g; e_i = e^{G_i}, ebar_i = e^{G_last - G_i},
// gamma = e^{G_last}; Gamma_ij = e^{G_i - G_j} for i >= j, else 0; s = scale):
//   forward (the h-walk, and again in the reverse step):
//     A     = (I + strict(diag(beta) K K^T))^-1        un-gated; T = Gamma o A
//     Rt    = V - e o (K h)      R = beta o Rt           [C x V]  (row scales)
//     Delta = T R                P = Gamma o (s Q K^T)   [C x V], [C x C]
//     O     = s e o (Q h) + P Delta
//     h'    = gamma h + K^T (ebar o Delta)
//   reverse step, given dO and dS = dL/dh' (products marked * are on the serial chain):
//     dDelta = P^T dO + ebar o (K dS)*                   Z = T^T dDelta*
//     dS_prev = gamma dS + s Q^T (e o dO) - K^T ((beta e) o Z)*
//     dV     = beta o Z
//     dT     = mask(dDelta R^T)   dA = Gamma o dT   dL = strict(-A^T dA A^T)
//     dP     = mask(dO Delta^T)   dQK = s Gamma o dP
//     dQ     = s e o (dO h^T) + dQK K
//     dK     = -(beta e) o (Z h^T) + dQK^T Q + ebar o (Delta dS^T) + (M + M^T) K,
//              M = diag(beta) dL
//     dbeta  = rowdot(Z, Rt) + rowdot(dL, K K^T)
//     dG     = e o (s rowdot(Q, dO h^T) - beta o rowdot(Z, K h))   (rowdot(Q, dO h^T) =
//              rowdot(dO, Q h): the reverse step reuses dq's dO h^T and never forms Q h)
//              - ebar o rowdot(K dS, Delta) (+ its sum at the last row) + gamma <dS, h> (last row)
//              + rowsum(T o dT) - colsum(T o dT) + rowsum(P o dP) - colsum(P o dP)
//     dg     = reverse cumsum of dG within the chunk
// dG leaves out the terms that cancel exactly (the diagonals of T o dT and P o dP; ebar_i debar_i
// at the last row, where ebar = 1): summed in floating point they leave O(eps) residue, which
// swamps the true dg under strong decay (g = -20: dg ~ e^-20), as in walk_a_bwd/kernel.cuh.
// GDN only (scalar gate), as the GPU kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "ref/dense.hpp"
#include "ref/problem.hpp"

namespace cake::ref::gdn_model {

namespace detail {

using dense::Mat;
using dense::matmul;
using dense::rows;

// One chunk's forward quantities, from its inputs and start state h.
struct ChunkForward {
  int64_t c;
  Mat G, e, ebar;     // [c]
  double gamma;       // e^{G_last}
  Mat Gamma;          // [c x c] e^{G_i - G_j} for i >= j, else 0
  Mat KKt, A, T, P;   // [c x c]
  Mat Kh, Qh, Rt, R;  // [c x V]
  Mat Delta;          // [c x V]
};

inline ChunkForward chunk_forward(Mat const& Q, Mat const& K, Mat const& V, Mat const& beta,
                                  Mat const& g, Mat const& h, int64_t c, int64_t dk, int64_t dv,
                                  double scale) {
  ChunkForward f;
  f.c = c;
  f.G.assign(c, 0.0);
  for (int64_t i = 0; i < c; ++i) f.G[i] = g[i] + (i > 0 ? f.G[i - 1] : 0.0);
  f.e.resize(c);
  f.ebar.resize(c);
  for (int64_t i = 0; i < c; ++i) {
    f.e[i] = std::exp(f.G[i]);
    f.ebar[i] = std::exp(f.G[c - 1] - f.G[i]);
  }
  f.gamma = std::exp(f.G[c - 1]);
  f.Gamma.assign(c * c, 0.0);
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j <= i; ++j) f.Gamma[i * c + j] = std::exp(f.G[i] - f.G[j]);

  // A = (I + L)^-1 with L = strict(diag(beta) K K^T), column by column (forward substitution)
  f.KKt = matmul(K, K, c, dk, c, false, true);
  f.A.assign(c * c, 0.0);
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = j; i < c; ++i) {
      double x = i == j ? 1.0 : 0.0;
      for (int64_t m = j; m < i; ++m) x -= beta[i] * f.KKt[i * c + m] * f.A[m * c + j];
      f.A[i * c + j] = x;
    }
  f.T.resize(c * c);
  f.P.resize(c * c);
  Mat const QKt = matmul(Q, K, c, dk, c, false, true);
  for (int64_t idx = 0; idx < c * c; ++idx) {
    f.T[idx] = f.Gamma[idx] * f.A[idx];
    f.P[idx] = f.Gamma[idx] * scale * QKt[idx];
  }

  f.Kh = matmul(K, h, c, dk, dv);
  f.Qh = matmul(Q, h, c, dk, dv);
  f.Rt.resize(c * dv);
  f.R.resize(c * dv);
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j < dv; ++j) {
      f.Rt[i * dv + j] = V[i * dv + j] - f.e[i] * f.Kh[i * dv + j];
      f.R[i * dv + j] = beta[i] * f.Rt[i * dv + j];
    }
  f.Delta = matmul(f.T, f.R, c, c, dv);
  return f;
}

// h' = gamma h + K^T (ebar o Delta)
inline Mat next_state(ChunkForward const& f, Mat const& K, Mat const& h, int64_t dk, int64_t dv) {
  Mat d = f.Delta;
  for (int64_t i = 0; i < f.c; ++i)
    for (int64_t j = 0; j < dv; ++j) d[i * dv + j] *= f.ebar[i];
  Mat next = matmul(K, d, dk, f.c, dv, true);
  for (int64_t idx = 0; idx < dk * dv; ++idx) next[idx] += f.gamma * h[idx];
  return next;
}

}  // namespace detail

// The backward of the GDN chunked algorithm as an h-walk plus one reverse walk (see the top of
// this file). Same contract as ref::chunked_backward for Gate::kScalar.
inline void walk_backward(Shape const& shape, Inputs const& in, OutputGrads const& grad_out,
                          InputGrads const& grad, int64_t chunk_size) {
  using namespace detail;
  int64_t const H = shape.num_qk_heads, HV = shape.num_v_heads;
  int64_t const dk = shape.head_dim_k, dv = shape.head_dim_v;
  int64_t const T = shape.num_tokens;
  double const s = in.scale;
  std::fill(grad.dq, grad.dq + T * H * dk, 0.0);
  std::fill(grad.dk, grad.dk + T * H * dk, 0.0);

  for (int64_t n = 0; n < shape.num_seqs(); ++n) {
    int64_t const bos = shape.cu_seqlens[n], eos = shape.cu_seqlens[n + 1];
    int64_t const num_chunks = (eos - bos + chunk_size - 1) / chunk_size;
    // value heads in ascending order, so that dq, dk sum over a group in a fixed order
    for (int64_t hv = 0; hv < HV; ++hv) {
      int64_t const head = hv / shape.group_size();
      int64_t const state = (n * HV + hv) * dk * dv;
      auto chunk_inputs = [&](int64_t j, Mat& Q, Mat& K, Mat& V, Mat& beta, Mat& g, int64_t& t0,
                              int64_t& c) {
        t0 = bos + j * chunk_size;
        c = std::min(chunk_size, eos - t0);
        Q = rows(in.q, t0, c, H, head, dk);
        K = rows(in.k, t0, c, H, head, dk);
        V = rows(in.v, t0, c, HV, hv, dv);
        beta = rows(in.beta, t0, c, HV, hv, 1);
        g = rows(in.g, t0, c, HV, hv, 1);
      };

      // The h-walk: chunk-start states (bf16 in HBM on the GPU)
      std::vector<Mat> hs(num_chunks);
      Mat h(dk * dv, 0.0);
      if (in.h0 != nullptr) h.assign(in.h0 + state, in.h0 + state + dk * dv);
      for (int64_t j = 0; j < num_chunks; ++j) {
        Mat Q, K, V, beta, g;
        int64_t t0, c;
        chunk_inputs(j, Q, K, V, beta, g, t0, c);
        hs[j] = h;
        ChunkForward const f = chunk_forward(Q, K, V, beta, g, h, c, dk, dv, s);
        h = next_state(f, K, h, dk, dv);
      }

      // The reverse walk: dS = dL/d(chunk-end state)
      Mat dS(dk * dv, 0.0);
      if (grad_out.dht != nullptr) dS.assign(grad_out.dht + state, grad_out.dht + state + dk * dv);
      for (int64_t j = num_chunks - 1; j >= 0; --j) {
        Mat Q, K, V, beta, g;
        int64_t t0, c;
        chunk_inputs(j, Q, K, V, beta, g, t0, c);
        Mat const& hj = hs[j];
        ChunkForward const f = chunk_forward(Q, K, V, beta, g, hj, c, dk, dv, s);
        Mat const dO = rows(grad_out.d_o, t0, c, HV, hv, dv);

        // the chain: dDelta, Z, then the previous chunk's dS
        Mat const KdS = matmul(K, dS, c, dk, dv);
        Mat dDelta = matmul(f.P, dO, c, c, dv, true);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t x = 0; x < dv; ++x) dDelta[i * dv + x] += f.ebar[i] * KdS[i * dv + x];
        Mat const Z = matmul(f.T, dDelta, c, c, dv, true);
        Mat beZ = Z, eO = dO;
        for (int64_t i = 0; i < c; ++i)
          for (int64_t x = 0; x < dv; ++x) {
            beZ[i * dv + x] *= beta[i] * f.e[i];
            eO[i * dv + x] *= f.e[i];
          }
        Mat const QteO = matmul(Q, eO, dk, c, dv, true);
        Mat const KtbeZ = matmul(K, beZ, dk, c, dv, true);
        Mat dS_prev(dk * dv);
        for (int64_t idx = 0; idx < dk * dv; ++idx)
          dS_prev[idx] = f.gamma * dS[idx] + s * QteO[idx] - KtbeZ[idx];

        // dv
        for (int64_t i = 0; i < c; ++i)
          for (int64_t x = 0; x < dv; ++x)
            grad.dv[((t0 + i) * HV + hv) * dv + x] = beta[i] * Z[i * dv + x];

        // dT, dA, dL; dP
        Mat dT = matmul(dDelta, f.R, c, dv, c, false, true);
        Mat dP = matmul(dO, f.Delta, c, dv, c, false, true);
        Mat dA(c * c), dQK(c * c);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t k = 0; k < c; ++k) {
            if (k > i) dT[i * c + k] = dP[i * c + k] = 0.0;
            dA[i * c + k] = f.Gamma[i * c + k] * dT[i * c + k];
            dQK[i * c + k] = s * f.Gamma[i * c + k] * dP[i * c + k];
          }
        Mat const AtdA = matmul(f.A, dA, c, c, c, true);
        Mat dL = matmul(AtdA, f.A, c, c, c, false, true);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t k = 0; k < c; ++k) dL[i * c + k] = k < i ? -dL[i * c + k] : 0.0;

        // dq, dk (this value head's terms; summed over the group's value heads)
        Mat const dOht = matmul(dO, hj, c, dv, dk, false, true);
        Mat const dQKK = matmul(dQK, K, c, c, dk);
        Mat const Zht = matmul(Z, hj, c, dv, dk, false, true);
        Mat const dQKtQ = matmul(dQK, Q, c, c, dk, true);
        Mat const DdSt = matmul(f.Delta, dS, c, dv, dk, false, true);
        Mat M(c * c);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t k = 0; k < c; ++k) M[i * c + k] = beta[i] * dL[i * c + k];
        Mat MMt(c * c);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t k = 0; k < c; ++k) MMt[i * c + k] = M[i * c + k] + M[k * c + i];
        Mat const MK = matmul(MMt, K, c, c, dk);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t x = 0; x < dk; ++x) {
            int64_t const at = ((t0 + i) * H + head) * dk + x;
            grad.dq[at] += s * f.e[i] * dOht[i * dk + x] + dQKK[i * dk + x];
            grad.dk[at] += -beta[i] * f.e[i] * Zht[i * dk + x] + dQKtQ[i * dk + x] +
                           f.ebar[i] * DdSt[i * dk + x] + MK[i * dk + x];
          }

        // dbeta and dG (row dots), then dg by the reverse cumsum
        Mat dG(c, 0.0);
        double last = f.gamma * std::inner_product(dS.begin(), dS.end(), hj.begin(), 0.0);
        for (int64_t i = 0; i < c; ++i) {
          double z_rt = 0, o_qh = 0, z_kh = 0, kds_delta = 0;
          for (int64_t x = 0; x < dv; ++x) {
            z_rt += Z[i * dv + x] * f.Rt[i * dv + x];
            z_kh += Z[i * dv + x] * f.Kh[i * dv + x];
            kds_delta += KdS[i * dv + x] * f.Delta[i * dv + x];
          }
          for (int64_t x = 0; x < dk; ++x) o_qh += Q[i * dk + x] * dOht[i * dk + x];
          double l_kk = 0;
          for (int64_t k = 0; k < i; ++k) l_kk += dL[i * c + k] * f.KKt[i * c + k];
          grad.dbeta[(t0 + i) * HV + hv] = z_rt + l_kk;
          dG[i] += f.e[i] * (s * o_qh - beta[i] * z_kh);
          if (i < c - 1) {
            dG[i] -= f.ebar[i] * kds_delta;
            last += f.ebar[i] * kds_delta;
          }
          for (int64_t k = 0; k < i; ++k) {
            double const gate = f.T[i * c + k] * dT[i * c + k] + f.P[i * c + k] * dP[i * c + k];
            dG[i] += gate;
            dG[k] -= gate;
          }
        }
        dG[c - 1] += last;
        double acc = 0;
        for (int64_t i = c - 1; i >= 0; --i) {
          acc += dG[i];
          grad.dg[(t0 + i) * HV + hv] = acc;
        }
        dS = dS_prev;
      }
      if (grad.dh0 != nullptr) std::copy(dS.begin(), dS.end(), grad.dh0 + state);
    }
  }
}

}  // namespace cake::ref::gdn_model
