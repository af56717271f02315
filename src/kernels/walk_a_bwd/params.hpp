// Host <-> device contract of the fused reverse walk (kernel.cuh says what it computes), for the
// decay policy of the launch (common/decay.hpp): ScalarDecay (GDN) forms every gradient;
// ChannelDecay (KDA) reads kkt_solve<ChannelDecay>'s operands and hands the intra pass
// (intra_bwd) its inputs, the fields marked ChannelDecay below.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::walk_a_bwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;     // [BT, H, K]      (normalised when the op normalises);
                                        //                 ChannelDecay: qg [BT, HV, K]
  __nv_bfloat16 const* k = nullptr;     // [BT, H, K];     ChannelDecay: kg [BT, HV, K]
  __nv_bfloat16 const* v = nullptr;     // [BT, HV, V]
  __nv_bfloat16 const* dout = nullptr;  // [BT, HV, V]
  __nv_bfloat16 const* a = nullptr;     // [BT, HV, 64]    kkt_solve's (I + diag(beta) L)^-1
  float const* gcum = nullptr;          // [BT, HV]        G, from kkt_solve (ScalarDecay)
  float const* beta = nullptr;          // [BT, HV]        fp32 beta, from kkt_solve
  __nv_bfloat16 const* h = nullptr;     // [num_slots, HV, K, V] chunk-start states (h-walk)
  // nullptr (h was there before the launch: saved mode), or the h-walk's [N, HV] flags
  // (walk_a_fwd::Params::walk_done): the walk is then launched as the h-walk's programmatic
  // dependent, and each walk waits until its own flag says all of its h is stored (kSlicesOfH)
  // before it reads h.
  int const* h_ready = nullptr;
  float const* dht = nullptr;  // [N, HV, K, V]   or nullptr (zero)
  // The split form (kernel.cuh, "The split form"): the dS-walk (launch_ds_walk) writes ds_end,
  // the chunk pass (launch with ds_end) reads it in place of the walk's carried dS.
  float* ds_end_out = nullptr;    // [num_slots, HV, K, V] dS-walk: dS of each chunk's end state
  float const* ds_end = nullptr;  // [num_slots, HV, K, V] or nullptr (the walk): the chunk pass,
                                  //                 one CTA per (chunk, value head)
  // ScalarDecay: dq and dk summed over each q/k head's value heads in ascending order (the
  // value head with index 0 in its group stores its terms, the others add theirs at L2, each in
  // its turn: bitwise reproducible; kernel.cuh). The walk and the chunk pass write them (the same
  // sums bit for bit); the dS-walk neither writes them nor takes turns.
  float* dq = nullptr;  // [BT, H, K]      out
  float* dk = nullptr;  // [BT, H, K]      out
  // zeroed before the launch (ScalarDecay with group_size() > 1, else nullptr): the ticket
  // counter, then the turns of dq and of dk, [num_slots, H] each (walk_order_size). The split
  // form's chunk pass takes its tickets from it (the dS-walk does not touch it).
  int* order = nullptr;
  // ScalarDecay: every value head adds its dq and dk terms at L2 in whatever order the walks
  // reach them, into dq and dk zeroed before the launch (order unused: nullptr); the sums are
  // then not bitwise reproducible (cakeOptions_t::unordered_sums)
  bool unordered_sum = false;
  __nv_bfloat16* dv = nullptr;  // [BT, HV, V]     out or nullptr (not wanted)
  void* dbeta = nullptr;        // [BT, HV]        out or nullptr: fp32, or bf16 when
                                //                 dbeta_is_bf16
  bool dbeta_is_bf16 = false;
  float* dg = nullptr;   // [BT, HV]        out or nullptr
  float* dh0 = nullptr;  // [N, HV, K, V]   out or nullptr
  // eO enters the dS update as bf16 hi + lo (one more [128 x 128 x 64] product per chunk): dh0 at
  // FLA's error. The op sets it when the problem has an initial state, not when dh0 is wanted,
  // so that every gradient is bitwise the same whichever others are wanted.
  bool eo_split = false;  // ScalarDecay only (ChannelDecay's launch refuses it)
  // ChannelDecay: inputs from kkt_solve<ChannelDecay>
  float const* glast = nullptr;         // [num_slots, HV, K] G of each chunk's last token
  __nv_bfloat16 const* kbar = nullptr;  // [BT, HV, K]     k o e^{G_last - G}
  __nv_bfloat16 const* aqk = nullptr;   // [BT, HV, 64]    P
  // ChannelDecay: outputs for the intra pass (intra_bwd::Params has the same fields)
  float* dqk = nullptr;         // [BT, HV, 64]  s mask_{i >= j}(dO Delta^T)
  float* dl = nullptr;          // [BT, HV, 64]  dL, strictly lower
  float* dqg = nullptr;         // [BT, HV, K]   s dO h^T
  float* dkg = nullptr;         // [BT, HV, K]   -(beta Z) h^T
  float* dkbar = nullptr;       // [BT, HV, K]   Delta dS^T
  float* dgamma = nullptr;      // [num_slots, HV, K]  rowdot(dS, h) per row of h
  float* dbeta_walk = nullptr;  // [BT, HV]      rowdot(Z, Rt)
};

// Params::order: the ticket counter, then dq's turns and dk's turns, [num_slots, H] each.
inline constexpr int kDqTurns = 0;
inline constexpr int kDkTurns = 1;
inline int64_t walk_order_size(Problem const& p) { return 1 + 2 * p.num_slots * p.num_qk_heads; }

// The split form's two launches from the walk's Params p; ds_end [num_slots, HV, K, V] fp32.
// The dS-walk (launch_ds_walk) writes ds_end and dh0 and no dq or dk, so it takes no ticket.
inline Params ds_walk_params(Params p, float* ds_end) {
  p.ds_end_out = ds_end;
  p.dq = nullptr;
  p.dk = nullptr;
  p.order = nullptr;
  p.unordered_sum = false;
  return p;
}
// The chunk pass (launch with ds_end): the stored dS in place of the carried one; dh0 is the
// dS-walk's.
inline Params chunk_pass_params(Params p, float const* ds_end) {
  p.ds_end = ds_end;
  p.dh0 = nullptr;
  return p;
}

}  // namespace cake::kernels::walk_a_bwd
