// An FP64 model of the KDA kernels (docs/design/kda-hopper.md): the chunk pass of
// kkt_solve<ChannelDecay>, the forward walk on its operands, and the backward as the GPU is to run
// it: an h-walk, one reverse walk per (document, value head) that forms what needs the chunk's
// state h or the gradient dS of its end state, then a chunk-parallel pass for the gated products'
// gradients. It is the specification the kernels follow, product by product; its test
// (tests/cpp/test_kda_walk_model.cpp) holds it to the stage-by-stage reference (ref/chunked.hpp,
// Gate::kChannel). FP64, no rounding: where the GPU splits an exponential
// (kkt_solve/channel_kkt.cuh) this forms e^{G_i - G_j} directly.
//
// Per chunk of c rows (G [c x K] the chunk-local cumsum of g, per key channel; e = e^G,
// ebar = e^{G_last - G}, gamma = e^{G_last} [K]; Gamma_ij = e^{G_i - G_j} per channel, i >= j).
// Chunk pass:
//   S_ij = <k_i, k_j o Gamma_ij> (i > j)        A = T = (I + strict(diag(beta) S))^-1
//   P_ij = s <q_i, k_j o Gamma_ij> (i >= j)     qg = Q o e, kg = K o e, kbar = K o ebar
// Forward step:
//   Rt = V - kg h    R = beta o Rt    Delta = A R
//   O = s qg h + P Delta                        h' = diag(gamma) h + kbar^T Delta
// Reverse step, given dO and dS = dL/dh' (the chain: dDelta, Z, dS_prev):
//   dDelta = P^T dO + kbar dS                   Z = A^T dDelta
//   dS_prev = diag(gamma) dS + s qg^T dO - kg^T (beta o Z)
//   dv = beta o Z                               dbeta_walk = rowdot(Z, Rt)
//   dqg = s dO h^T    dkg = -(beta o Z) h^T     dkbar = Delta dS^T    dgamma = rowdot(dS, h)
//   dA = mask_{i >= j}(dDelta R^T)              dL = strict(-A^T dA A^T)
//   dP = mask_{i >= j}(dO Delta^T)
// Intra pass (the gated products' adjoints, channel by channel; M = diag(beta) dL):
//   dbeta = dbeta_walk + rowdot(dL, S)
//   dq_i += sum_{j <= i} s dP_ij k_j o Gamma_ij
//   dk_j += sum_{i >= j} s dP_ij q_i o Gamma_ij + sum_{i > j} M_ij k_i o Gamma_ij
//   dk_i += sum_{j < i} M_ij k_j o Gamma_ij
//   dG_i += q_i o (its row sums) + k_i o (its row sums of M), dG_j -= k_j o (its column sums)
//   dq += dqg o e    dk += dkg o e + dkbar o ebar
//   dG += dqg o qg + dkg o kg - dkbar o kbar (rows but the last); the last row also gets
//         gamma o dgamma + the sum of dkbar o kbar over the other rows
//   dg = reverse cumsum of dG within the chunk
// dG leaves out what cancels exactly (P's diagonal pairs, ebar's last row, where ebar = 1), as the
// GDN kernels do: summed in floating point it leaves residue that swamps a true dg ~ e^-20.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "ref/dense.hpp"
#include "ref/problem.hpp"

namespace cake::ref::kda_model {

using dense::Mat;
using dense::matmul;
using dense::rows;

// One chunk's inputs and what kkt_solve<ChannelDecay> forms from them.
struct ChunkPass {
  int64_t c, dk;
  Mat Q, K, beta;    // [c x dk], [c x dk], [c]
  Mat G, e, ebar;    // [c x dk]
  Mat gamma;         // [dk]
  Mat S, A, P;       // [c x c]: gated K K^T (strict), T, s causal gated Q K^T
  Mat qg, kg, kbar;  // [c x dk]

  double gate(int64_t i, int64_t j, int64_t x) const {  // Gamma_ij in channel x, i >= j
    return std::exp(G[i * dk + x] - G[j * dk + x]);
  }
};

inline ChunkPass chunk_pass(Mat Q, Mat K, Mat beta, Mat const& g, int64_t c, int64_t dk, double s) {
  ChunkPass f{
      c,           dk,          std::move(Q), std::move(K),    std::move(beta), Mat(c * dk),
      Mat(c * dk), Mat(c * dk), Mat(dk),      Mat(c * c, 0.0), Mat(c * c, 0.0), Mat(c * c, 0.0),
      Mat(c * dk), Mat(c * dk), Mat(c * dk)};
  for (int64_t i = 0; i < c; ++i)
    for (int64_t x = 0; x < dk; ++x)
      f.G[i * dk + x] = g[i * dk + x] + (i > 0 ? f.G[(i - 1) * dk + x] : 0.0);
  for (int64_t x = 0; x < dk; ++x) f.gamma[x] = std::exp(f.G[(c - 1) * dk + x]);
  for (int64_t i = 0; i < c; ++i)
    for (int64_t x = 0; x < dk; ++x) {
      int64_t const at = i * dk + x;
      f.e[at] = std::exp(f.G[at]);
      f.ebar[at] = std::exp(f.G[(c - 1) * dk + x] - f.G[at]);
      f.qg[at] = f.Q[at] * f.e[at];
      f.kg[at] = f.K[at] * f.e[at];
      f.kbar[at] = f.K[at] * f.ebar[at];
    }
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      double sk = 0, pq = 0;
      for (int64_t x = 0; x < dk; ++x) {
        double const gate = f.gate(i, j, x);
        sk += f.K[i * dk + x] * f.K[j * dk + x] * gate;
        pq += f.Q[i * dk + x] * f.K[j * dk + x] * gate;
      }
      if (j < i) f.S[i * c + j] = sk;
      f.P[i * c + j] = s * pq;
    }
  // A = (I + strict(diag(beta) S))^-1, column by column (forward substitution)
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = j; i < c; ++i) {
      double x = i == j ? 1.0 : 0.0;
      for (int64_t m = j; m < i; ++m) x -= f.beta[i] * f.S[i * c + m] * f.A[m * c + j];
      f.A[i * c + j] = x;
    }
  return f;
}

// The forward walk's step on chunk f from state h [dk x dv].
struct WalkStep {
  Mat Kh, Rt, R, Delta;  // [c x dv]
  Mat O;                 // [c x dv]
  Mat next;              // [dk x dv]: h'
};

inline WalkStep walk_step(ChunkPass const& f, Mat const& V, Mat const& h, int64_t dv, double s) {
  int64_t const c = f.c, dk = f.dk;
  WalkStep w;
  w.Kh = matmul(f.kg, h, c, dk, dv);
  w.Rt.resize(c * dv);
  w.R.resize(c * dv);
  for (int64_t i = 0; i < c; ++i)
    for (int64_t x = 0; x < dv; ++x) {
      w.Rt[i * dv + x] = V[i * dv + x] - w.Kh[i * dv + x];
      w.R[i * dv + x] = f.beta[i] * w.Rt[i * dv + x];
    }
  w.Delta = matmul(f.A, w.R, c, c, dv);
  w.O = matmul(f.qg, h, c, dk, dv);
  Mat const PD = matmul(f.P, w.Delta, c, c, dv);
  for (int64_t idx = 0; idx < c * dv; ++idx) w.O[idx] = s * w.O[idx] + PD[idx];
  w.next = matmul(f.kbar, w.Delta, dk, c, dv, true);
  for (int64_t r = 0; r < dk; ++r)
    for (int64_t x = 0; x < dv; ++x) w.next[r * dv + x] += f.gamma[r] * h[r * dv + x];
  return w;
}

// What the reverse walk's step hands on (the chain's dS_prev) and leaves for the intra pass.
struct ReverseStep {
  Mat dS_prev;          // [dk x dv]
  Mat dv, dbeta_walk;   // [c x dv], [c]: rowdot(Z, Rt)
  Mat dqg, dkg, dkbar;  // [c x dk]
  Mat dgamma;           // [dk]
  Mat dL, dP;           // [c x c]: dL (strict), s-free dP (i >= j)
};

inline ReverseStep reverse_step(ChunkPass const& f, WalkStep const& w, Mat const& h, Mat const& dO,
                                Mat const& dS, int64_t dv, double s) {
  int64_t const c = f.c, dk = f.dk;
  ReverseStep r;
  Mat dDelta = matmul(f.P, dO, c, c, dv, true);
  Mat const kbar_dS = matmul(f.kbar, dS, c, dk, dv);
  for (int64_t idx = 0; idx < c * dv; ++idx) dDelta[idx] += kbar_dS[idx];
  Mat const Z = matmul(f.A, dDelta, c, c, dv, true);
  Mat bZ = Z;
  for (int64_t i = 0; i < c; ++i)
    for (int64_t x = 0; x < dv; ++x) bZ[i * dv + x] *= f.beta[i];
  Mat const qgt_dO = matmul(f.qg, dO, dk, c, dv, true);
  Mat const kgt_bZ = matmul(f.kg, bZ, dk, c, dv, true);
  r.dS_prev.resize(dk * dv);
  for (int64_t y = 0; y < dk; ++y)
    for (int64_t x = 0; x < dv; ++x) {
      int64_t const at = y * dv + x;
      r.dS_prev[at] = f.gamma[y] * dS[at] + s * qgt_dO[at] - kgt_bZ[at];
    }
  r.dv = bZ;

  r.dqg = matmul(dO, h, c, dv, dk, false, true);
  for (double& x : r.dqg) x *= s;
  r.dkg = matmul(bZ, h, c, dv, dk, false, true);
  for (double& x : r.dkg) x = -x;
  r.dkbar = matmul(w.Delta, dS, c, dv, dk, false, true);
  r.dgamma.assign(dk, 0.0);
  for (int64_t y = 0; y < dk; ++y)
    for (int64_t x = 0; x < dv; ++x) r.dgamma[y] += dS[y * dv + x] * h[y * dv + x];

  Mat dA = matmul(dDelta, w.R, c, dv, c, false, true);
  r.dP = matmul(dO, w.Delta, c, dv, c, false, true);
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = i + 1; j < c; ++j) dA[i * c + j] = r.dP[i * c + j] = 0.0;
  Mat const At_dA = matmul(f.A, dA, c, c, c, true);
  r.dL = matmul(At_dA, f.A, c, c, c, false, true);
  r.dbeta_walk.resize(c);
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j < c; ++j) r.dL[i * c + j] = j < i ? -r.dL[i * c + j] : 0.0;
    double z_rt = 0;
    for (int64_t x = 0; x < dv; ++x) z_rt += Z[i * dv + x] * w.Rt[i * dv + x];
    r.dbeta_walk[i] = z_rt;
  }
  return r;
}

// The intra pass: dq, dk (this value head's terms), dG [c x dk] and dbeta of a chunk from the
// reverse step's outputs.
struct IntraGrads {
  Mat dq, dk, dG;  // [c x dk]
  Mat dbeta;       // [c]
};

inline IntraGrads intra_backward(ChunkPass const& f, ReverseStep const& r, double s) {
  int64_t const c = f.c, dk = f.dk;
  IntraGrads out{Mat(c * dk, 0.0), Mat(c * dk, 0.0), Mat(c * dk, 0.0), r.dbeta_walk};
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j < i; ++j) out.dbeta[i] += r.dL[i * c + j] * f.S[i * c + j];
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      double const p = s * r.dP[i * c + j];
      double const m = f.beta[i] * r.dL[i * c + j];
      for (int64_t x = 0; x < dk; ++x) {
        double const gate = f.gate(i, j, x);
        double const qi = f.Q[i * dk + x], ki = f.K[i * dk + x], kj = f.K[j * dk + x];
        out.dq[i * dk + x] += p * kj * gate;
        out.dk[j * dk + x] += (p * qi + m * ki) * gate;
        out.dk[i * dk + x] += m * kj * gate;
        if (j < i) {  // a pair's dG: +row, -column; the diagonal cancels exactly
          double const t = (p * qi + m * ki) * kj * gate;
          out.dG[i * dk + x] += t;
          out.dG[j * dk + x] -= t;
        }
      }
    }
  double const* const gamma = f.gamma.data();
  for (int64_t i = 0; i < c; ++i)
    for (int64_t x = 0; x < dk; ++x) {
      int64_t const at = i * dk + x;
      out.dq[at] += r.dqg[at] * f.e[at];
      out.dk[at] += r.dkg[at] * f.e[at] + r.dkbar[at] * f.ebar[at];
      out.dG[at] += r.dqg[at] * f.qg[at] + r.dkg[at] * f.kg[at];
      if (i < c - 1) {
        double const t = r.dkbar[at] * f.kbar[at];
        out.dG[at] -= t;
        out.dG[(c - 1) * dk + x] += t;
      }
    }
  for (int64_t x = 0; x < dk; ++x) out.dG[(c - 1) * dk + x] += gamma[x] * r.dgamma[x];
  return out;
}

// The forward as the walk runs it. Same contract as ref::chunked_forward for Gate::kChannel.
inline void walk_forward(Shape const& shape, Inputs const& in, Outputs const& out,
                         int64_t chunk_size) {
  int64_t const H = shape.num_qk_heads, HV = shape.num_v_heads;
  int64_t const dk = shape.head_dim_k, dv = shape.head_dim_v;
  for (int64_t n = 0; n < shape.num_seqs(); ++n) {
    int64_t const bos = shape.cu_seqlens[n], eos = shape.cu_seqlens[n + 1];
    for (int64_t hv = 0; hv < HV; ++hv) {
      int64_t const head = hv / shape.group_size();
      int64_t const state = (n * HV + hv) * dk * dv;
      Mat h(dk * dv, 0.0);
      if (in.h0 != nullptr) h.assign(in.h0 + state, in.h0 + state + dk * dv);
      for (int64_t t0 = bos; t0 < eos; t0 += chunk_size) {
        int64_t const c = std::min(chunk_size, eos - t0);
        ChunkPass const f = chunk_pass(
            rows(in.q, t0, c, H, head, dk), rows(in.k, t0, c, H, head, dk),
            rows(in.beta, t0, c, HV, hv, 1), rows(in.g, t0, c, HV, hv, dk), c, dk, in.scale);
        WalkStep const w = walk_step(f, rows(in.v, t0, c, HV, hv, dv), h, dv, in.scale);
        for (int64_t i = 0; i < c; ++i)
          for (int64_t x = 0; x < dv; ++x) out.o[((t0 + i) * HV + hv) * dv + x] = w.O[i * dv + x];
        h = w.next;
      }
      if (out.ht != nullptr) std::copy(h.begin(), h.end(), out.ht + state);
    }
  }
}

// The backward as the kernels run it: the h-walk, the reverse walk, the intra pass, dg's reverse
// cumsum, and dq, dk summed over each q/k head's value heads in ascending order. Same contract as
// ref::chunked_backward for Gate::kChannel.
inline void walk_backward(Shape const& shape, Inputs const& in, OutputGrads const& grad_out,
                          InputGrads const& grad, int64_t chunk_size) {
  int64_t const H = shape.num_qk_heads, HV = shape.num_v_heads;
  int64_t const dk = shape.head_dim_k, dv = shape.head_dim_v;
  int64_t const T = shape.num_tokens;
  double const s = in.scale;
  std::fill(grad.dq, grad.dq + T * H * dk, 0.0);
  std::fill(grad.dk, grad.dk + T * H * dk, 0.0);
  for (int64_t n = 0; n < shape.num_seqs(); ++n) {
    int64_t const bos = shape.cu_seqlens[n], eos = shape.cu_seqlens[n + 1];
    int64_t const num_chunks = (eos - bos + chunk_size - 1) / chunk_size;
    for (int64_t hv = 0; hv < HV; ++hv) {
      int64_t const head = hv / shape.group_size();
      int64_t const state = (n * HV + hv) * dk * dv;
      auto pass = [&](int64_t j) {
        int64_t const t0 = bos + j * chunk_size, c = std::min(chunk_size, eos - t0);
        return chunk_pass(rows(in.q, t0, c, H, head, dk), rows(in.k, t0, c, H, head, dk),
                          rows(in.beta, t0, c, HV, hv, 1), rows(in.g, t0, c, HV, hv, dk), c, dk, s);
      };
      auto values = [&](int64_t j) {
        int64_t const t0 = bos + j * chunk_size;
        return rows(in.v, t0, std::min(chunk_size, eos - t0), HV, hv, dv);
      };

      std::vector<Mat> hs(num_chunks);  // the h-walk: chunk-start states
      Mat h(dk * dv, 0.0);
      if (in.h0 != nullptr) h.assign(in.h0 + state, in.h0 + state + dk * dv);
      for (int64_t j = 0; j < num_chunks; ++j) {
        hs[j] = h;
        h = walk_step(pass(j), values(j), h, dv, s).next;
      }

      Mat dS(dk * dv, 0.0);
      if (grad_out.dht != nullptr) dS.assign(grad_out.dht + state, grad_out.dht + state + dk * dv);
      for (int64_t j = num_chunks - 1; j >= 0; --j) {
        int64_t const t0 = bos + j * chunk_size;
        ChunkPass const f = pass(j);
        int64_t const c = f.c;
        WalkStep const w = walk_step(f, values(j), hs[j], dv, s);
        ReverseStep const r =
            reverse_step(f, w, hs[j], rows(grad_out.d_o, t0, c, HV, hv, dv), dS, dv, s);
        IntraGrads const g = intra_backward(f, r, s);
        for (int64_t i = 0; i < c; ++i) {
          for (int64_t x = 0; x < dv; ++x)
            grad.dv[((t0 + i) * HV + hv) * dv + x] = r.dv[i * dv + x];
          grad.dbeta[(t0 + i) * HV + hv] = g.dbeta[i];
          for (int64_t x = 0; x < dk; ++x) {
            int64_t const at = ((t0 + i) * H + head) * dk + x;
            grad.dq[at] += g.dq[i * dk + x];
            grad.dk[at] += g.dk[i * dk + x];
          }
        }
        for (int64_t x = 0; x < dk; ++x) {
          double acc = 0;
          for (int64_t i = c - 1; i >= 0; --i) {
            acc += g.dG[i * dk + x];
            grad.dg[((t0 + i) * HV + hv) * dk + x] = acc;
          }
        }
        dS = r.dS_prev;
      }
      if (grad.dh0 != nullptr) std::copy(dS.begin(), dS.end(), grad.dh0 + state);
    }
  }
}

}  // namespace cake::ref::kda_model
