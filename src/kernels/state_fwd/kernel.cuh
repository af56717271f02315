// Forward state walk (stage F5 of fla_reference.md §2.2): one CTA per (document, value head,
// 32-column V slice), walking the document's chunks in order with the state slice in fp32 shared
// memory. Per chunk (h = state at the chunk's start, [128 x 32] fp32):
//   store bf16(h) to h[slot]                                  (read by the output stage)
//   Delta = U - W h                   [64 x 32]  -> v_new (bf16)
//   h     = e^{G_last} h + (K e^{G_last - G})^T Delta         (fp32 accumulate)
// Both products run on the tensor cores with bf16 operands (h and Delta are rounded as operands,
// as in FLA); the state itself never leaves fp32 until the final state is written.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/state_fwd/params.hpp"

namespace cake::kernels::state_fwd {

inline constexpr int kThreads = 128;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kSliceV = 32;  // V columns per CTA: 4 slices x N x HV CTAs
inline constexpr int kLdSlice = kSliceV + 4;   // fp32 slice rows
inline constexpr int kLdSliceB = kSliceV + 8;  // bf16 slice rows: 80 bytes, ldmatrix conflict-free

// About 74 KB: three CTAs per SM, which hide each other's load latency (no prefetch yet).
struct SharedStorage {
  float h[kHeadDim * kLdSlice];              // [128 x 32] state slice, fp32
  __nv_bfloat16 hb[kHeadDim * kLdSliceB];    // [128 x 32] bf16(h), the operand of W h
  __nv_bfloat16 k[kChunk * kLdBf16];         // [64 x 128]
  __nv_bfloat16 w[kChunk * kLdBf16];         // [64 x 128]
  __nv_bfloat16 u[kChunk * kLdSliceB];       // [64 x 32]
  __nv_bfloat16 delta[kChunk * kLdSliceB];   // [64 x 32] bf16(Delta e^{G_last - G})
  float gcum[kChunk];
};
static_assert(kHeadDim % kSliceV == 0, "V must split into whole slices");
static_assert(sizeof(SharedStorage) <= 227 * 1024, "state_fwd shared memory exceeds 227 KB");

__global__ void __launch_bounds__(kThreads) state_fwd_kernel(__grid_constant__ Params const p) {
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
  int64_t const begin = p.problem.seq_begin(n);
  int64_t const seq_len = p.problem.seq_begin(n + 1) - begin;
  int64_t const slot0 = p.problem.slot_base(n);
  int64_t const state_offset = (int64_t{n} * HV + hv) * kHeadDim * kHeadDim + v0;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  for (int idx = tid; idx < kHeadDim * kSliceV; idx += kThreads) {
    int const r = idx / kSliceV;
    int const col = idx % kSliceV;
    s.h[r * kLdSlice + col] = p.h0 != nullptr ? p.h0[state_offset + r * kHeadDim + col] : 0.f;
  }
  __syncthreads();  // initial state visible to the first chunk's conversion

  int64_t const num_chunks = (seq_len + kChunk - 1) / kChunk;
  for (int64_t j = 0; j < num_chunks; ++j) {
    int64_t const t0 = begin + j * kChunk;
    int const len = static_cast<int>(seq_len - j * kChunk < kChunk ? seq_len - j * kChunk : kChunk);
    load_tile_bf16_async<kChunk, kHeadDim, kThreads>(s.k, kLdBf16, p.k + (t0 * H + h) * kHeadDim,
                                                     int64_t{H} * kHeadDim, len);
    load_tile_bf16_async<kChunk, kHeadDim, kThreads>(
        s.w, kLdBf16, p.w + (t0 * HV + hv) * kHeadDim, v_stride, len);
    load_tile_bf16_async<kChunk, kSliceV, kThreads>(
        s.u, kLdSliceB, p.u + (t0 * HV + hv) * kHeadDim + v0, v_stride, len);
    if (tid < kChunk)
      cp_async_4(&s.gcum[tid], p.gcum + (t0 + (tid < len ? tid : 0)) * HV + hv, tid < len);
    cp_async_commit();

    // h (the chunk's start state) -> bf16 operand and the per-chunk store, while the tiles load.
    __nv_bfloat16* h_out = p.h + ((slot0 + j) * HV + hv) * kHeadDim * kHeadDim + v0;
    for (int idx = tid; idx < kHeadDim * kSliceV / 2; idx += kThreads) {
      int const r = idx / (kSliceV / 2);
      int const col = (idx % (kSliceV / 2)) * 2;
      __nv_bfloat162 const hv2 =
          __floats2bfloat162_rn(s.h[r * kLdSlice + col], s.h[r * kLdSlice + col + 1]);
      *reinterpret_cast<__nv_bfloat162*>(s.hb + r * kLdSliceB + col) = hv2;
      *reinterpret_cast<__nv_bfloat162*>(h_out + r * kHeadDim + col) = hv2;
    }
    cp_async_wait<0>();
    __syncthreads();  // tiles, G and bf16(h) visible
    float const g_last = s.gcum[len - 1];

    // Delta = U - W h
    __nv_bfloat16* const v_new = p.v_new + (t0 * HV + hv) * kHeadDim + v0;
    block_gemm<kChunk, kSliceV, kHeadDim, 1, 4, kWarps>(
        RowMajor{s.w, kLdBf16}, RowMajor{s.hb, kLdSliceB},
        [&](int i, int col, float c0, float c1) {
          float2 const u = __bfloat1622float2(
              *reinterpret_cast<__nv_bfloat162 const*>(s.u + i * kLdSliceB + col));
          float const d0 = u.x - c0;
          float const d1 = u.y - c1;
          float const decay = i < len ? __expf(g_last - s.gcum[i]) : 0.f;
          if (i < len)
            *reinterpret_cast<__nv_bfloat162*>(v_new + i * v_stride + col) =
                __floats2bfloat162_rn(d0, d1);
          *reinterpret_cast<__nv_bfloat162*>(s.delta + i * kLdSliceB + col) =
              __floats2bfloat162_rn(decay * d0, decay * d1);
        });
    __syncthreads();  // Delta complete

    // h = e^{G_last} h + (K e^{G_last - G})^T Delta
    float const gamma = __expf(g_last);
    block_gemm<kHeadDim, kSliceV, kChunk, 1, 4, kWarps>(
        ColMajor{s.k, kLdBf16}, RowMajor{s.delta, kLdSliceB},
        [&](int r, int col, float c0, float c1) {
          float2* const h2 = reinterpret_cast<float2*>(s.h + r * kLdSlice + col);
          float2 const old = *h2;
          *h2 = make_float2(gamma * old.x + c0, gamma * old.y + c1);
        });
    __syncthreads();  // state updated before the next chunk's loads overwrite k, w, u
  }

  if (p.ht != nullptr) {
    for (int idx = tid; idx < kHeadDim * kSliceV; idx += kThreads) {
      int const r = idx / kSliceV;
      int const col = idx % kSliceV;
      p.ht[state_offset + r * kHeadDim + col] = s.h[r * kLdSlice + col];
    }
  }
#endif
}

}  // namespace cake::kernels::state_fwd
