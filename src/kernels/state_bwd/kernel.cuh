// Backward state walk (B5 of fla_reference.md §2.5): one CTA per (document, value head,
// 32-column V slice), walking the chunks from the last to the first with dS' (the gradient of the
// chunk's END state, [128 x 32]) in fp32 shared memory, starting from dht. Per chunk:
//   store bf16(dS') to dh[slot]
//   dDelta = A^T dO + (K e^{G_last - G}) dS'                           [64 x 32] fp32, in place
//   dS'    = e^{G_last} dS' + scale (Q e^G)^T dO - W^T dDelta          (gradient of the start state)
// The second product is one tensor-core product over [scale (Q e^G) | -W]^T x [dO ; dDelta].
// After the first chunk dS' is dh0.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/state_bwd/params.hpp"

namespace cake::kernels::state_bwd {

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kSliceV = 32;
inline constexpr int kLdSlice = kSliceV + 4;

struct SharedStorage {
  float ds[kHeadDim * kLdSlice];        // [128 x 32] dS', fp32
  __nv_bfloat16 q[kChunk * kLdBf16];    // [64 x 128]
  __nv_bfloat16 k[kChunk * kLdBf16];    // [64 x 128]
  __nv_bfloat16 w[kChunk * kLdBf16];    // [64 x 128]
  float dout[kChunk * kLdSlice];        // [64 x 32]
  float ddelta[kChunk * kLdSlice];      // [64 x 32]
  float gcum[kChunk];
  float q_scale[kChunk];                // scale e^{G_i}
  float k_scale[kChunk];                // e^{G_last - G_i}
};
static_assert(kHeadDim % kSliceV == 0, "V must split into whole slices");
static_assert(sizeof(SharedStorage) <= 227 * 1024, "state_bwd shared memory exceeds 227 KB");

__global__ void __launch_bounds__(kThreads) state_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  int const n = blockIdx.x;
  int const hv = blockIdx.y;
  int const v0 = blockIdx.z * kSliceV;
  int const HV = p.problem.num_v_heads;
  int const H = p.problem.num_qk_heads;
  int const h = hv / p.problem.group_size();
  int const tid = threadIdx.x;
  float const scale = p.problem.scale;
  int64_t const begin = p.problem.seq_begin(n);
  int64_t const seq_len = p.problem.seq_begin(n + 1) - begin;
  int64_t const slot0 = p.problem.slot_base(n);
  int64_t const state_offset = (int64_t{n} * HV + hv) * kHeadDim * kHeadDim + v0;

  for (int idx = tid; idx < kHeadDim * kSliceV; idx += kThreads) {
    int const r = idx / kSliceV;
    int const col = idx % kSliceV;
    s.ds[r * kLdSlice + col] = p.dht != nullptr ? p.dht[state_offset + r * kHeadDim + col] : 0.f;
  }

  int64_t const num_chunks = (seq_len + kChunk - 1) / kChunk;
  for (int64_t j = num_chunks - 1; j >= 0; --j) {
    int64_t const t0 = begin + j * kChunk;
    int const len = static_cast<int>(seq_len - j * kChunk < kChunk ? seq_len - j * kChunk : kChunk);
    load_tile_bf16<kChunk, kHeadDim, kThreads>(s.q, kLdBf16, p.q + (t0 * H + h) * kHeadDim,
                                               int64_t{H} * kHeadDim, len);
    load_tile_bf16<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (t0 * H + h) * kHeadDim,
                                               int64_t{H} * kHeadDim, len);
    load_tile_bf16<kChunk, kHeadDim, kThreads>(s.w, kLdBf16, p.w + (t0 * HV + hv) * kHeadDim,
                                               int64_t{HV} * kHeadDim, len);
    load_tile_bf16_to_f32<kChunk, kSliceV, kThreads>(
        s.dout, kLdSlice, p.dout + (t0 * HV + hv) * kHeadDim + v0, int64_t{HV} * kHeadDim, len);
    if (tid < kChunk) s.gcum[tid] = p.gcum[(t0 + (tid < len ? tid : len - 1)) * HV + hv];
    __syncthreads();  // tiles and the previous (later) chunk's dS' update are visible
    float const g_last = s.gcum[len - 1];
    if (tid < kChunk) {
      s.q_scale[tid] = scale * __expf(s.gcum[tid]);
      s.k_scale[tid] = __expf(g_last - s.gcum[tid]);
    }

    __nv_bfloat16* dh_out = p.dh + ((slot0 + j) * HV + hv) * kHeadDim * kHeadDim + v0;
    for (int idx = tid; idx < kHeadDim * kSliceV; idx += kThreads) {
      int const r = idx / kSliceV;
      int const col = idx % kSliceV;
      dh_out[r * kHeadDim + col] = __float2bfloat16(s.ds[r * kLdSlice + col]);
    }
    __syncthreads();  // q_scale, k_scale visible

    // dDelta = A^T dO (already in dv_new) + (K e^{G_last - G}) dS'
    block_gemm<kChunk, kSliceV, kHeadDim, 1, 4, kWarps>(
        [&](int i, int kk) { return s.k_scale[i] * to_float(s.k[i * kLdBf16 + kk]); },
        [&](int kk, int col) { return s.ds[kk * kLdSlice + col]; },
        [&](int i, int col, float acc) {
          if (i < len) {
            float* const dd = p.dv_new + ((t0 + i) * HV + hv) * kHeadDim + v0 + col;
            float const val = *dd + acc;
            *dd = val;
            s.ddelta[i * kLdSlice + col] = val;
          } else {
            s.ddelta[i * kLdSlice + col] = 0.f;
          }
        });
    __syncthreads();  // dDelta complete; every read of dS' for this chunk done

    // dS' = e^{G_last} dS' + scale (Q e^G)^T dO - W^T dDelta
    float const gamma = __expf(g_last);
    block_gemm<kHeadDim, kSliceV, 2 * kChunk, 1, 4, kWarps>(
        [&](int r, int m) {
          return m < kChunk ? s.q_scale[m] * to_float(s.q[m * kLdBf16 + r])
                            : -to_float(s.w[(m - kChunk) * kLdBf16 + r]);
        },
        [&](int m, int col) {
          return m < kChunk ? s.dout[m * kLdSlice + col] : s.ddelta[(m - kChunk) * kLdSlice + col];
        },
        [&](int r, int col, float acc) {
          s.ds[r * kLdSlice + col] = gamma * s.ds[r * kLdSlice + col] + acc;
        });
    __syncthreads();  // dS' updated before the next chunk's loads overwrite the tiles
  }

  if (p.dh0 != nullptr) {
    for (int idx = tid; idx < kHeadDim * kSliceV; idx += kThreads) {
      int const r = idx / kSliceV;
      int const col = idx % kSliceV;
      p.dh0[state_offset + r * kHeadDim + col] = s.ds[r * kLdSlice + col];
    }
  }
#endif
}

}  // namespace cake::kernels::state_bwd
