// Backward state walk (B5 of fla_reference.md §2.5): one CTA per (document, value head,
// 64-column V slice), walking the chunks from the last to the first with dS' (the gradient of the
// chunk's END state, [128 x 64] fp32, in registers) starting from dht. Per chunk:
//   store bf16(dS') to dh[slot]
//   dDelta = A^T dO + (K e^{G_last - G}) dS'                           [64 x 64] fp32
//   dS'    = e^{G_last} dS' + scale (Q e^G)^T dO - W^T dDelta   (gradient of the start state)
// The second product is one tensor-core product over [scale (Q e^G) | -W]^T x [dO ; dDelta].
// After the first chunk dS' is dh0.
//
// As in the forward walk (state_fwd/kernel.cuh): the state stays in registers (each warp owns 16
// rows), the previous chunk's tiles load (cp.async, double buffer) while this chunk computes, and a
// chunk costs two barriers. The tiles of a chunk take ~86 KB, so one CTA of 8 warps holds an SM.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/gemm.cuh"
#include "kernels/common/tile.cuh"
#include "kernels/common/walk.cuh"
#include "kernels/state_bwd/params.hpp"

namespace cake::kernels::state_bwd {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kSliceV = 64;
inline constexpr int kLdSlice = kSliceV + 8;   // bf16 slice rows: 144 bytes, ldmatrix conflict-free
inline constexpr int kLdSliceF = kSliceV + 4;  // fp32 slice rows

// One chunk's operands; two of them alternate (the previous chunk loads while this one computes).
struct ChunkTiles {
  __nv_bfloat16 qw[2 * kChunk * kLdBf16];    // [128 x 128] rows 0-63: Q, rows 64-127: W
  __nv_bfloat16 k[kChunk * kLdBf16];         // [64 x 128]
  __nv_bfloat16 rhs[2 * kChunk * kLdSlice];  // [128 x 64] rows 0-63: dO -> scale e^G dO;
                                             //           rows 64-127: -dDelta
  float dv_new[kChunk * kLdSliceF];          // [64 x 64] A^T dO from dv_local_bwd
  float gcum[kChunk];
};

// About 191 KB: one CTA per SM.
struct SharedStorage {
  ChunkTiles tiles[2];
  __nv_bfloat16 dsb[kHeadDim * kLdSlice];  // [128 x 64] bf16(dS'), operand of (K e) dS'
};
static_assert(kHeadDim % kSliceV == 0, "V must split into whole slices");
static_assert(kWarps * 16 == kHeadDim, "each warp owns 16 rows of dS'");
// dDelta's warp tiles: [16 x 32] (1 x 4 mma tiles of 16 x 8), one per warp.
inline constexpr int kDeltaNi = 4;
static_assert(kWarps * 16 * 8 * kDeltaNi == kChunk * kSliceV, "the warps tile dDelta");
static_assert(sizeof(SharedStorage) <= 227 * 1024, "state_bwd shared memory exceeds 227 KB");

__device__ __forceinline__ void load_chunk(ChunkTiles& t, Params const& p, int64_t t0, int len,
                                           int h, int hv, int v0) {
  int const H = p.problem.num_qk_heads;
  int const HV = p.problem.num_v_heads;
  int64_t const qk_stride = int64_t{H} * kHeadDim;
  int64_t const v_stride = int64_t{HV} * kHeadDim;
  load_tile_async<kChunk, kHeadDim, kThreads>(t.qw, kLdBf16, p.q + (t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(
      t.qw + kChunk * kLdBf16, kLdBf16, p.w + (t0 * HV + hv) * kHeadDim, v_stride, len);
  load_tile_async<kChunk, kHeadDim, kThreads>(t.k, kLdBf16, p.k + (t0 * H + h) * kHeadDim,
                                              qk_stride, len);
  load_tile_async<kChunk, kSliceV, kThreads>(
      t.rhs, kLdSlice, p.dout + (t0 * HV + hv) * kHeadDim + v0, v_stride, len);
  load_tile_async<kChunk, kSliceV, kThreads>(
      t.dv_new, kLdSliceF, p.dv_new + (t0 * HV + hv) * kHeadDim + v0, v_stride, len);
  load_gcum_async(t.gcum, p.gcum, t0, len, HV, hv);
  cp_async_commit();
}

__global__ void __launch_bounds__(kThreads, 1) state_bwd_kernel(__grid_constant__ Params const p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) char smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage*>(smem_raw);
  WalkRef const walk = walk_of_block(p.problem, blockIdx.x, kHeadDim / kSliceV);
  int const hv = walk.hv;
  int const v0 = walk.slice * kSliceV;
  int const HV = p.problem.num_v_heads;
  int const h = hv / p.problem.group_size();
  int const tid = threadIdx.x;
  int const warp = tid / 32;
  float const scale = p.problem.scale;
  WalkSpan const span = walk_span(p.problem, walk);
  int64_t const state_offset = (int64_t{walk.n} * HV + hv) * kHeadDim * kHeadDim + v0;
  int64_t const v_stride = int64_t{HV} * kHeadDim;

  // This warp's rows of dS': rows 16 warp .. + 15, all 64 columns of the slice.
  int const row0 = warp * 16;
  StateRows<kSliceV> ds;
  load_state_rows<kSliceV>(ds, row0, p.dht, state_offset);

  int64_t const num_chunks = span.num_chunks();
  if (num_chunks > 0)
    load_chunk(s.tiles[(num_chunks - 1) % 2], p, span.begin + (num_chunks - 1) * kChunk,
               span.chunk_len(num_chunks - 1), h, hv, v0);
  for (int64_t j = num_chunks - 1; j >= 0; --j) {
    ChunkTiles& t = s.tiles[j % 2];
    int64_t const t0 = span.begin + j * kChunk;
    int const len = span.chunk_len(j);

    // dS' (gradient of this chunk's end state) -> bf16 operand. dsb's last reader (K dS' of chunk
    // j + 1) finished before that chunk's second barrier.
    store_acc_bf16<1, kSliceV / 8>(row0, 0, ds, s.dsb, kLdSlice);
    cp_async_wait<0>();
    __syncthreads();  // chunk j's tiles and bf16(dS') visible; chunk j + 1's tiles no longer read
    if (j > 0) load_chunk(s.tiles[(j - 1) % 2], p, t0 - kChunk, span.chunk_len(j - 1), h, hv, v0);

    // bf16(dS') -> dh[slot] in 16-byte vectors
    __nv_bfloat16* const dh_out = p.dh + ((span.slot0 + j) * HV + hv) * kHeadDim * kHeadDim + v0;
    for (int idx = tid; idx < kHeadDim * kSliceV / 8; idx += kThreads) {
      int const r = idx / (kSliceV / 8);
      int const c = (idx % (kSliceV / 8)) * 8;
      *reinterpret_cast<uint4*>(dh_out + r * kHeadDim + c) =
          *reinterpret_cast<uint4 const*>(s.dsb + r * kLdSlice + c);
    }
    float const g_last = t.gcum[len - 1];

    // rhs rows 0-63: dO <- scale e^{G_i} dO, in place (rows past the end are zero)
    for (int idx = tid; idx < kChunk * kSliceV / 2; idx += kThreads) {
      int const r = idx / (kSliceV / 2);
      int const col = (idx % (kSliceV / 2)) * 2;
      float const qs = scale * __expf(t.gcum[r]);
      auto* const d2 = reinterpret_cast<__nv_bfloat162*>(t.rhs + r * kLdSlice + col);
      float2 const f = __bfloat1622float2(*d2);
      *d2 = __floats2bfloat162_rn(qs * f.x, qs * f.y);
    }
    // dDelta = A^T dO + e^{G_last - G_i} (K dS'); rhs rows 64-127 <- -dDelta
    // (K dS' on this warp's [16 x 32] tile of the [64 x 64] slice; the decays of the thread's two
    // rows d_row, d_row + 8 once, not per element pair)
    float* const dd = p.dv_new + (t0 * HV + hv) * kHeadDim + v0;
    int const d_m0 = 16 * (warp / (kSliceV / (8 * kDeltaNi)));
    int const d_n0 = 8 * kDeltaNi * (warp % (kSliceV / (8 * kDeltaNi)));
    int const d_row = d_m0 + tid % 32 / 4;
    float kds[1][kDeltaNi][4] = {};
    warp_tile_mma<kHeadDim, 1, kDeltaNi>(RowMajor{t.k, kLdBf16}, RowMajor{s.dsb, kLdSlice}, d_m0,
                                         d_n0, kds);
    float const decay_lo = __expf(g_last - t.gcum[d_row]);
    float const decay_hi = __expf(g_last - t.gcum[d_row + 8]);
    for_each_acc_pair<1, kDeltaNi>(d_m0, d_n0, kds, [&](int i, int col, float& c0, float& c1) {
      float2 val = make_float2(0.f, 0.f);
      if (i < len) {
        float const decay = i % 16 < 8 ? decay_lo : decay_hi;  // d_m0 is a multiple of 16
        float2 const intra = *reinterpret_cast<float2 const*>(t.dv_new + i * kLdSliceF + col);
        val = make_float2(intra.x + decay * c0, intra.y + decay * c1);
        *reinterpret_cast<float2*>(dd + i * v_stride + col) = val;
      }
      *reinterpret_cast<__nv_bfloat162*>(t.rhs + (kChunk + i) * kLdSlice + col) =
          __floats2bfloat162_rn(-val.x, -val.y);
    });
    __syncthreads();  // rhs complete

    // dS' = e^{G_last} dS' + [Q ; W]^T [scale e^G dO ; -dDelta], in registers
    float const gamma = __expf(g_last);
    for_each_acc_pair<1, kSliceV / 8>(row0, 0, ds, [&](int, int, float& c0, float& c1) {
      c0 *= gamma;
      c1 *= gamma;
    });
    warp_tile_mma<2 * kChunk, 1, kSliceV / 8>(ColMajor{t.qw, kLdBf16}, RowMajor{t.rhs, kLdSlice},
                                              row0, 0, ds);
  }

  if (p.dh0 != nullptr) store_state_rows<kSliceV>(ds, row0, p.dh0, state_offset);
#endif
}

}  // namespace cake::kernels::state_bwd
