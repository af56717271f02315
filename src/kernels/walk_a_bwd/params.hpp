// Host <-> device contract of the fused reverse walk (kernel.cuh says what it computes).
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/problem.hpp"

namespace cake::kernels::walk_a_bwd {

struct Params {
  Problem problem;
  __nv_bfloat16 const* q = nullptr;     // [BT, H, K]      (normalised when the op normalises)
  __nv_bfloat16 const* k = nullptr;     // [BT, H, K]
  __nv_bfloat16 const* v = nullptr;     // [BT, HV, V]
  __nv_bfloat16 const* dout = nullptr;  // [BT, HV, V]
  __nv_bfloat16 const* a = nullptr;     // [BT, HV, 64]    kkt_solve's (I + diag(beta) L)^-1
  float const* gcum = nullptr;          // [BT, HV]        G, from kkt_solve
  float const* beta = nullptr;          // [BT, HV]        fp32 beta, from kkt_solve
  __nv_bfloat16 const* h = nullptr;     // [num_slots, HV, K, V] chunk-start states (h-walk)
  // nullptr (h was there before the launch: saved mode), or the h-walk's [N, HV] flags
  // (walk_a_fwd::Params::walk_done): the walk is then launched as the h-walk's programmatic
  // dependent, and each walk waits on its own flag before it reads h.
  int const* h_ready = nullptr;
  float const* dht = nullptr;           // [N, HV, K, V]   or nullptr (zero)
  float* dq = nullptr;                  // [BT, HV, K]     out: this value head's dq terms
  float* dk = nullptr;                  // [BT, HV, K]     out: this value head's dk terms
  __nv_bfloat16* dv = nullptr;          // [BT, HV, V]     out or nullptr (not wanted)
  void* dbeta = nullptr;                // [BT, HV]        out or nullptr: fp32, or bf16 when
                                        //                 dbeta_is_bf16
  bool dbeta_is_bf16 = false;
  float* dg = nullptr;                  // [BT, HV]        out or nullptr
  float* dh0 = nullptr;                 // [N, HV, K, V]   out or nullptr
  // eO enters the dS update as bf16 hi + lo (one more [128 x 128 x 64] product per chunk): dh0 at
  // FLA's error. The op sets it when the problem has an initial state, not when dh0 is wanted,
  // so that every gradient is bitwise the same whichever others are wanted.
  bool eo_split = false;
};

}  // namespace cake::kernels::walk_a_bwd
