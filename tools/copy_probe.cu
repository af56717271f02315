// How much does a cp.async tile copy cost, by which thread copies which 16-byte vector and by
// the destination's layout? The walks copy [64 x 128] bf16 tiles (Q, K, V, dO) from rows of a
// [T, heads, 128] tensor into blocked tiles (wgmma.cuh). Nsight Compute's source counters at
// workload A (v20) charge each of the walks' cp.async 32 "L1 Wavefronts Shared" against an ideal
// of 4; this probe asks whether another mapping or a padded layout lowers that, and the time.
// Measured on the H200 (2026-11-30, bench/results/2026-11-30-h200-session17-variants.jsonl):
// every blocked variant, the padded one included, is charged 32 per copy (row-major 272-byte rows
// 10.5), so that counter does not measure bank conflicts of these copies; by time, 1 thread per
// row (3.14-3.26 us per step) and row-major (3.18-3.37) beat 4 threads per row (3.87-3.99), and
// whole core matrices per quarter warp sit between (3.56). That last mapping in the walks
// (next/copy-core) did not move them (forward 12.59 vs 12.61-12.64 ms, stages 40.17 vs
// 39.84-40.08): their copies overlap other work.
// Each variant: 132 CTAs of 256 threads, each copying 4 tiles per step (64 KB) for kSteps steps
// (one cp.async group per step, waited for before the next), from a 256 MB buffer of 32 heads.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -I src -o /tmp/copy_probe tools/copy_probe.cu
//   /tmp/copy_probe                 (time per step, per variant, best of 5)
//   ncu --section SourceCounters -o /tmp/probe /tmp/copy_probe 1   (wavefronts per copy: the
//   source page's "L1 Wavefronts Shared" of the LDGSTS, as tools/device_check.sh's `sources`)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/common/ptx.cuh"

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kRows = 64;
constexpr int kCols = 128;
constexpr int kVecs = kCols / 8;   // 16-byte vectors per row
constexpr int kHeads = 32;
constexpr int kTokens = 1 << 15;  // 32 K tokens x 32 heads x 128 x 2 bytes = 256 MB
constexpr int kTiles = 4;
constexpr int kSteps = 256;

// Element offset of (r, c) in a tile: `stride` elements between core matrices along a row (64:
// the blocked layout of wgmma.cuh; 72: 16 bytes of padding after each), or row-major with a
// 272-byte padded row (tile.cuh's kLdBf16) when stride is 0.
__device__ __forceinline__ int offset(int r, int c, int stride) {
  if (stride == 0) return r * 136 + c;
  return (r / 8) * kVecs * stride + (c / 8) * stride + (r % 8) * 8 + c % 8;
}

// Which vector (row r, vector index vec) thread tid copies in its copy number i of a tile
// (kRows * kVecs / kThreads = 4 copies per thread and tile), by `threads_per_row`: that many
// adjacent threads share a row (taking vectors q, q + threads_per_row, ...); 0 for one thread per
// row (adjacent threads take adjacent rows, vector i * 4 + tid / 64); -1 for whole core matrices
// (warp w: rows 8 w .. 8 w + 7, lane l row l % 8 of the copy's 4 core matrices, l / 8 the one).
__device__ __forceinline__ void vector_of(int tid, int i, int threads_per_row, int& r, int& vec) {
  if (threads_per_row == -1) {
    r = tid / 32 * 8 + tid % 8;
    vec = i * 4 + tid % 32 / 8;
    return;
  }
  if (threads_per_row == 0) {
    r = tid % kRows;
    vec = i * (kThreads / kRows) + tid / kRows;
    return;
  }
  int const rows_per_pass = kThreads / threads_per_row;
  int const copies_per_row = kVecs / threads_per_row;  // per thread and pass
  int const pass = i / copies_per_row;
  r = tid / threads_per_row + pass * rows_per_pass;
  vec = tid % threads_per_row + (i % copies_per_row) * threads_per_row;
}

__global__ void __launch_bounds__(kThreads) copy_tiles(bf16 const* src, int threads_per_row,
                                                       int stride, int* sink) {
  extern __shared__ __align__(128) bf16 smem[];
  int const tile_elems = stride == 0 ? kRows * 136 : kRows / 8 * kVecs * stride;
  int const tid = threadIdx.x;
  for (int step = 0; step < kSteps; ++step) {
    int64_t const t0 = (int64_t{blockIdx.x} * kSteps + step) * kRows % kTokens;
    for (int tile = 0; tile < kTiles; ++tile) {
      bf16 const* s = src + (t0 * kHeads + (blockIdx.x + tile) % kHeads) * kCols;
      for (int i = 0; i < kRows * kVecs / kThreads; ++i) {
        int r, vec;
        vector_of(tid, i, threads_per_row, r, vec);
        cake::kernels::cp_async_16(smem + tile * tile_elems + offset(r, 8 * vec, stride),
                                   s + int64_t{r} * kHeads * kCols + 8 * vec, true);
      }
    }
    cake::kernels::cp_async_commit();
    cake::kernels::cp_async_wait<0>();
    __syncthreads();
  }
  if (tid == 0) sink[blockIdx.x] = reinterpret_cast<int const*>(smem)[blockIdx.x % 64];
}

int main(int argc, char** argv) {
  int const reps = argc > 1 ? std::atoi(argv[1]) : 5;  // 1 under Nsight Compute
  bf16* src;
  int* sink;
  cudaMalloc(&src, size_t{kTokens} * kHeads * kCols * sizeof(bf16));
  cudaMemset(src, 0, size_t{kTokens} * kHeads * kCols * sizeof(bf16));
  cudaMalloc(&sink, 1024 * sizeof(int));
  struct Variant {
    char const* name;
    int threads_per_row;
    int stride;
  };
  Variant const variants[] = {
      {"blocked, 4 threads per row (the walks' load_tile_blocked_async)", 4, 64},
      {"blocked, 16 threads per row", 16, 64},
      {"blocked, 1 thread per row", 0, 64},
      {"blocked, 4 whole core matrices per warp and copy", -1, 64},
      {"blocked + 16 B per core matrix, 4 threads per row", 4, 72},
      {"blocked + 16 B per core matrix, 16 threads per row", 16, 72},
      {"row-major, 272-byte rows, 16 threads per row (load_tile_async)", 16, 0},
  };
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (Variant const& v : variants) {
    int const smem = kTiles * (v.stride == 0 ? kRows * 136 : kRows / 8 * kVecs * v.stride) * 2;
    cudaFuncSetAttribute(copy_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    float best = 1e30f;
    for (int rep = 0; rep < reps; ++rep) {
      cudaEventRecord(start);
      copy_tiles<<<132, kThreads, smem>>>(src, v.threads_per_row, v.stride, sink);
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms;
      cudaEventElapsedTime(&ms, start, stop);
      if (ms < best) best = ms;
    }
    std::printf("%-66s %7.3f us per step (64 KB per CTA)\n", v.name, 1000.f * best / kSteps);
  }
  cudaError_t const err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
