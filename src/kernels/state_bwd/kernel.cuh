// Backward state walk (B5 of fla_reference.md §2.5): one CTA per (document, value head,
// 32-column V slice), walking the chunks from the last to the first with dS' (the gradient of the
// chunk's END state, [128 x 32]) in fp32 shared memory, starting from dht. Per chunk:
//   store bf16(dS') to dh[slot]
//   dDelta = A^T dO + (K e^{G_last - G}) dS'                           [64 x 32] fp32, in place
//   dS'    = e^{G_last} dS' + scale (Q e^G)^T dO - W^T dDelta   (gradient of the start state)
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
inline constexpr int kLdSlice = kSliceV + 4;   // fp32 slice rows (144 bytes)
inline constexpr int kLdSliceB = kSliceV + 8;  // bf16 slice rows: 80 bytes, ldmatrix conflict-free

// About 100 KB: two CTAs per SM.
struct SharedStorage {
  float ds[kHeadDim * kLdSlice];              // [128 x 32] dS', fp32
  __nv_bfloat16 dsb[kHeadDim * kLdSliceB];    // [128 x 32] bf16(dS'), operand of (K e) dS'
  __nv_bfloat16 qw[2 * kChunk * kLdBf16];     // [128 x 128] rows 0-63: Q, rows 64-127: W
  __nv_bfloat16 k[kChunk * kLdBf16];          // [64 x 128]
  __nv_bfloat16 rhs[2 * kChunk * kLdSliceB];  // [128 x 32] rows 0-63: scale e^G dO, 64-127: -dDelta
  float dv_new[kChunk * kLdSlice];            // [64 x 32] A^T dO from dv_local_bwd
  float gcum[kChunk];
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
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  for (int idx = tid; idx < kHeadDim * kSliceV; idx += kThreads) {
    int const r = idx / kSliceV;
    int const col = idx % kSliceV;
    s.ds[r * kLdSlice + col] = p.dht != nullptr ? p.dht[state_offset + r * kHeadDim + col] : 0.f;
  }
  __syncthreads();  // dht visible to the first chunk's conversion

  int64_t const num_chunks = (seq_len + kChunk - 1) / kChunk;
  for (int64_t j = num_chunks - 1; j >= 0; --j) {
    int64_t const t0 = begin + j * kChunk;
    int const len = static_cast<int>(seq_len - j * kChunk < kChunk ? seq_len - j * kChunk : kChunk);
    load_tile_bf16_async<kChunk, kHeadDim, kThreads>(s.qw, kLdBf16, p.q + (t0 * H + h) * kHeadDim,
                                                     qk_stride, len);
    load_tile_bf16_async<kChunk, kHeadDim, kThreads>(
        s.qw + kChunk * kLdBf16, kLdBf16, p.w + (t0 * HV + hv) * kHeadDim, v_stride, len);
    load_tile_bf16_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (t0 * H + h) * kHeadDim,
                                                     qk_stride, len);
    load_tile_bf16_async<kChunk, kSliceV, kThreads>(
        s.rhs, kLdSliceB, p.dout + (t0 * HV + hv) * kHeadDim + v0, v_stride, len);
    load_tile_f32_async<kChunk, kSliceV, kThreads>(
        s.dv_new, kLdSlice, p.dv_new + (t0 * HV + hv) * kHeadDim + v0, v_stride, len);
    if (tid < kChunk)  // rows past the end repeat G of the last token
      cp_async_4(&s.gcum[tid], p.gcum + (t0 + (tid < len ? tid : len - 1)) * HV + hv, true);
    cp_async_commit();

    // dS' (gradient of this chunk's end state) -> bf16 operand and dh[slot], while tiles load.
    __nv_bfloat16* dh_out = p.dh + ((slot0 + j) * HV + hv) * kHeadDim * kHeadDim + v0;
    for (int idx = tid; idx < kHeadDim * kSliceV / 2; idx += kThreads) {
      int const r = idx / (kSliceV / 2);
      int const col = (idx % (kSliceV / 2)) * 2;
      __nv_bfloat162 const d2 =
          __floats2bfloat162_rn(s.ds[r * kLdSlice + col], s.ds[r * kLdSlice + col + 1]);
      *reinterpret_cast<__nv_bfloat162*>(s.dsb + r * kLdSliceB + col) = d2;
      *reinterpret_cast<__nv_bfloat162*>(dh_out + r * kHeadDim + col) = d2;
    }
    cp_async_wait<0>();
    __syncthreads();  // tiles, G, bf16(dS') visible
    float const g_last = s.gcum[len - 1];

    // rhs rows 0-63: dO <- scale e^{G_i} dO, in place
    for (int idx = tid; idx < kChunk * kSliceV / 2; idx += kThreads) {
      int const r = idx / (kSliceV / 2);
      int const col = (idx % (kSliceV / 2)) * 2;
      float const qs = scale * __expf(s.gcum[r]);
      auto* d2 = reinterpret_cast<__nv_bfloat162*>(s.rhs + r * kLdSliceB + col);
      float2 const f = __bfloat1622float2(*d2);
      *d2 = __floats2bfloat162_rn(qs * f.x, qs * f.y);
    }
    // dDelta = A^T dO + e^{G_last - G_i} (K dS'); rhs rows 64-127 <- -dDelta
    float* const dd = p.dv_new + (t0 * HV + hv) * kHeadDim + v0;
    block_gemm<kChunk, kSliceV, kHeadDim, 1, 4, kWarps>(
        RowMajor{s.k, kLdBf16}, RowMajor{s.dsb, kLdSliceB},
        [&](int i, int col, float c0, float c1) {
          float2 val = make_float2(0.f, 0.f);
          if (i < len) {
            float const decay = __expf(g_last - s.gcum[i]);
            float2 const intra = *reinterpret_cast<float2 const*>(s.dv_new + i * kLdSlice + col);
            val = make_float2(intra.x + decay * c0, intra.y + decay * c1);
            *reinterpret_cast<float2*>(dd + i * v_stride + col) = val;
          }
          *reinterpret_cast<__nv_bfloat162*>(s.rhs + (kChunk + i) * kLdSliceB + col) =
              __floats2bfloat162_rn(-val.x, -val.y);
        });
    __syncthreads();  // rhs complete; every read of dS' for this chunk done

    // dS' = e^{G_last} dS' + [Q ; W]^T [scale e^G dO ; -dDelta]
    float const gamma = __expf(g_last);
    block_gemm<kHeadDim, kSliceV, 2 * kChunk, 1, 4, kWarps>(
        ColMajor{s.qw, kLdBf16}, RowMajor{s.rhs, kLdSliceB},
        [&](int r, int col, float c0, float c1) {
          float2* const d2 = reinterpret_cast<float2*>(s.ds + r * kLdSlice + col);
          float2 const old = *d2;
          *d2 = make_float2(gamma * old.x + c0, gamma * old.y + c1);
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
