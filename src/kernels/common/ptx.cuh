// Raw PTX behind named functions: the only file of cake with inline assembly. Under the CPU
// emulator (tests/emu, CAKE_EMULATE) the same functions come from emu/ptx.hpp instead.
#pragma once

#if defined(CAKE_EMULATE)
#include "emu/ptx.hpp"
#else

#include <cstdint>

#include "kernels/common/tensor_map.hpp"

namespace cake::kernels {

// The 32-bit shared-memory address of p (a generic pointer into shared memory), as the
// instructions below take it.
__device__ __forceinline__ uint32_t smem_u32(void const* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// D = A B + D on the tensor cores: one warp, A 16x16 bf16 (row), B 16x8 bf16 (col), D 16x8 fp32.
// Fragment ownership (lane = 4 * group + quad):
//   a[0]: A[group][2quad..+1]      a[1]: A[group+8][2quad..+1]
//   a[2]: A[group][2quad+8..+9]    a[3]: A[group+8][2quad+8..+9]
//   b[0]: B[2quad..+1][group]      b[1]: B[2quad+8..+9][group]
//   d[0..1]: D[group][2quad..+1]   d[2..3]: D[group+8][2quad..+1]
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], uint32_t const (&a)[4],
                                                  uint32_t const (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D = A B + D on the tensor cores in tf32: one warp, A 16x8 (row), B 8x8 (col), D 16x8 fp32.
// Fragment ownership (lane = 4 * group + quad):
//   a[0]: A[group][quad]      a[1]: A[group+8][quad]
//   a[2]: A[group][quad+4]    a[3]: A[group+8][quad+4]
//   b[0]: B[quad][group]    b[1]: B[quad+4][group]
//   d: as for mma_m16n8k16_bf16
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], uint32_t const (&a)[4],
                                                 uint32_t const (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Asynchronous 16-byte copy global -> shared (L2 only); valid == false writes 16 zero bytes and
// reads nothing (src must still be a mapped address).
__device__ __forceinline__ void cp_async_16(void* smem, void const* gmem, bool valid) {
  uint32_t const dst = smem_u32(smem);
  int const src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

// Asynchronous 4-byte copy global -> shared (through L1); valid == false writes zero.
__device__ __forceinline__ void cp_async_4(void* smem, void const* gmem, bool valid) {
  uint32_t const dst = smem_u32(smem);
  int const src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Starts bringing the 128-byte line of global memory that holds p into L2: a hint with nothing to
// wait for, for data that a CTA expected to start later will load.
__device__ __forceinline__ void prefetch_l2(void const* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p) : "memory");
}

// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix
// l / 8. Without .trans thread t gets (row t / 4, columns 2 (t % 4) + {0, 1}) of each matrix;
// with .trans it gets (rows 2 (t % 4) + {0, 1}, column t / 4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], void const* smem) {
  uint32_t const addr = smem_u32(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], void const* smem) {
  uint32_t const addr = smem_u32(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Four 8x8 bf16 matrices to shared memory, the inverse of ldmatrix_x4: lane l gives the address
// of row l % 8 of matrix l / 8, thread t holds (row t / 4, columns 2 (t % 4) + {0, 1}) of each.
__device__ __forceinline__ void stmatrix_x4(void* smem, uint32_t const (&r)[4]) {
  uint32_t const addr = smem_u32(smem);
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// Warpgroup matrix product (Hopper wgmma), D[64 x N] += A[64 x 16] B[16 x N], bf16 operands from
// shared memory (described by 64-bit matrix descriptors, kernels/common/wgmma.cuh), fp32
// accumulators in registers. Issued by all 128 threads of a warpgroup; asynchronous: until a
// wgmma_wait completes its group, neither its accumulators nor its operands in shared memory may
// be touched (the emulator, tests/emu, checks both). kTransA / kTransB: 0 for
// K-major operands, 1 for M-major A / N-major B. Accumulator ownership: warp w of the warpgroup
// holds rows 16 w .. 16 w + 15; d[4 j + 0..1] are row 16 w + group, columns 8 j + 2 quad + {0, 1};
// d[4 j + 2..3] the same columns of row + 8 (lane = 4 group + quad), i.e. mma_m16n8k16_bf16's
// layout for the 8-column blocks j = 0 .. N / 8 - 1 side by side. Always accumulates (scale-d
// true): zero the accumulators for a fresh product.
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n32k16_bf16(float (&d)[16], uint64_t desc_a,
                                                     uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %20, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, %18, %19;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "n"(kTransA), "n"(kTransB), "r"(1));
}

template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_bf16(float (&d)[32], uint64_t desc_a,
                                                     uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %36, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, %34, %35;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "n"(kTransA), "n"(kTransB), "r"(1));
}

template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[64], uint64_t desc_a,
                                                      uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, %66, %67;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "n"(kTransA), "n"(kTransB), "r"(1));
}

// Pins the accumulators at this point of the program: the compiler may not move their writes (a
// zeroing, a scale) across it, which it would otherwise do since it does not see that wgmma reads
// and writes them asynchronously. Before wgmma_fence() and after wgmma_wait() (as CUTLASS's
// warpgroup_fence_operand).
template <int kN>
__device__ __forceinline__ void fence_accumulators(float (&acc)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// Orders this thread's register and shared-memory accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed wgmma groups are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Orders this thread's generic-proxy accesses to shared memory (st.shared, cp.async, ld.shared)
// before the async proxy's (wgmma's operand reads, a bulk copy's writes); then a barrier before
// the wgmma or the copy.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// mbarrier (PTX ISA, "mbarrier"), a uint64_t in shared memory: an expected arrival count, the
// arrivals pending in the current phase and a transaction count in bytes; a phase completes when
// both are zero, and phases alternate parity 0, 1, 0, ... from init. A producer arrives with the
// bytes its bulk copies will bring (arrive_expect_tx), the copies complete them; a consumer waits
// for the phase of the parity it expects. init by one thread, then mbarrier_init_fence and a
// block barrier before any use.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
// Makes the inits visible to the async proxy (the bulk copies' complete_tx).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(tx_bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// A bulk copy global -> shared through the async proxy (no tensor map): `bytes` contiguous bytes
// from src to dst (both 16-byte aligned, bytes a multiple of 16), completing them on bar.
__device__ __forceinline__ void bulk_load(void* dst, void const* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// Bulk tensor copies global -> shared through the async proxy, completing their bytes on bar:
// the box of `map` at element coordinates (c0, c1[, c2]) (innermost first), in shared memory as
// the map's swizzle lays it (1024-byte aligned for the 128-byte swizzle), elements outside the
// tensor zero.
__device__ __forceinline__ void tma_load_2d(void* dst, TensorMap const* map, int c0, int c1,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, TensorMap const* map, int c0, int c1,
                                            int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}

// Bulk tensor stores shared -> global through the async proxy: the box of `map` at element
// coordinates (c0, c1, c2) (innermost first) from shared memory laid out as the map's swizzle
// lays it (the layout a load of that box writes). Per thread, as cp.async: commit closes the
// thread's open group; wait_read<n> returns once every group but the n newest has read its
// source (the shared memory may then be rewritten); wait<n> once their writes are complete. The
// shared memory written by the generic proxy is made visible to the store by
// fence_proxy_async_shared first; fence_proxy_async_global orders the completed writes before
// this thread's later generic ones (a flag another block reads).
__device__ __forceinline__ void tma_store_3d(TensorMap const* map, void const* src, int c0, int c1,
                                             int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::
          "l"(map),
      "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Named barriers (warp specialisation): barrier `id` (0 .. 15; 0 is __syncthreads's) completes
// once `num_threads` threads have arrived, counted by whole warps (a multiple of 32; every lane of
// a warp executes the same barrier instruction). sync arrives and waits for completion; arrive
// only counts this warp and continues (a producer signalling consumers that sync on the same id).
// Every arrival at one phase of a barrier names the same num_threads.
__device__ __forceinline__ void named_barrier_sync(int id, int num_threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int num_threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}

// Moves this warpgroup's register budget per thread to kRegs (warp specialisation: producers
// give registers back with dec, consumers take them with inc). Executed by all threads of the
// warpgroup; kRegs a multiple of 8 in 24 .. 256.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256,
                "setmaxnreg: a multiple of 8 in 24 .. 256");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256,
                "setmaxnreg: a multiple of 8 in 24 .. 256");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// threadIdx.x, read where it is called: a value the compiler cannot move out of a loop. A role
// short of registers otherwise computes every tid-derived offset (its tile copies' addresses)
// once before its loop and keeps them in local memory, reloading them at every step from L2.
__device__ __forceinline__ unsigned thread_index_here() {
  unsigned tid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  return tid;
}

// Programmatic dependent launch: lets the next kernel in the stream, launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, start once every block of this grid has
// called it (or exited), instead of when this grid has finished. Nothing of this grid's memory is
// promised to that kernel by it: what it reads of this grid waits on flags (signal_flag).
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// flag += share after every global store of the block: the barrier, then a release reduction at
// GPU scope by one thread (cumulative: it covers the block's stores ordered before it by the
// barrier). The CTAs of one piece of work each add their share, and its waiter waits for the
// total (wait_flag). All threads of the block call it.
__device__ __forceinline__ void signal_flag(int* flag, int share) {
  __syncthreads();
  if (threadIdx.x == 0)
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(flag), "r"(share) : "memory");
}

// Waits until other grids' signal_flag(flag, ...) have added up to total: one thread polls with
// acquire loads, then the barrier hands the acquired order to the block. All threads of the block
// call it.
__device__ __forceinline__ void wait_flag(int const* flag, int total) {
  if (threadIdx.x == 0) {
    int set = 0;
    for (;;) {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(set) : "l"(flag) : "memory");
      if (set >= total) break;
      __nanosleep(256);
    }
  }
  __syncthreads();
}

// An ordered reduction across CTAs (walk_a_bwd's sum of dq and dk over a group's value heads):
// each CTA takes a ticket, so that a CTA that runs has every lower ticket running or done (what
// it waits on is always a lower ticket, so no wait can outlast the CTAs it waits for); a turn
// counter per reduced block says how many terms are in; the CTA whose turn it is adds its term
// with reductions at L2 (fire and forget) and passes the turn on. The order of the terms is the
// tickets': the sum is bitwise the same run to run.

// The old value of *counter, then *counter + 1 (at GPU scope).
__device__ __forceinline__ int take_ticket(int* counter) {
  int old;
  asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;\n"
               : "=r"(old)
               : "l"(counter)
               : "memory");
  return old;
}

// *addr += (x, y) at L2 (two adjacent fp32; addr 8-byte aligned), relaxed at GPU scope.
__device__ __forceinline__ void reduce_add_f32x2(float* addr, float x, float y) {
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(x), "f"(y)
               : "memory");
}

// Polls *turn with acquire loads until it equals `value` (one thread; a barrier then hands the
// acquired order to the others).
__device__ __forceinline__ void wait_turn(int const* turn, int value) {
  for (;;) {
    int now;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(now) : "l"(turn) : "memory");
    if (now == value) return;
    __nanosleep(64);
  }
}

// *turn <- value with release at GPU scope (one thread, after a barrier that orders the
// participating threads' writes before it: cumulative).
__device__ __forceinline__ void pass_turn(int* turn, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(turn), "r"(value) : "memory");
}

}  // namespace cake::kernels

#endif  // CAKE_EMULATE
