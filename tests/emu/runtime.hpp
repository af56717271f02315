// A CPU emulator of the CUDA features cake's kernels use, so that the kernels' own source runs,
// unchanged, on a machine without a GPU (CI) and is checked against the FP64 reference there.
//
// What it is: every CUDA thread of a block is a fiber (own stack) on one OS thread; blocks run one
// after another. __syncthreads is a barrier of the block's fibers, and named barriers (bar.sync /
// bar.arrive id, count) count whole warps as the hardware does; warp-collective operations
// (shuffles, ballot, ldmatrix, mma.sync) meet the warp's 32 fibers and warpgroup ones (wgmma and
// its fence / commit / wait) the warpgroup's 128, and are computed once all have arrived, from the
// fragment layouts PTX documents (emu/ptx.hpp, emu/wgmma.cpp). cp.async lands at the wait_group
// that completes its group, its destination poisoned until then (cp_async_issue). wgmma is
// asynchronous as on the GPU: it reads its operands (descriptors into the block's shared memory,
// unswizzled canonical layouts) and accumulators at issue, and writes the product into the
// accumulator registers at the wgmma_wait that completes its group.
// Schedules: a fiber runs until it waits (a barrier, a collective) or yields at a preemption
// point; then the scheduler picks the next fiber from those ready: with seed 0 in thread order,
// round robin (the fixed order), else at random from the seed (set_schedule; CAKE_EMU_SEED, else
// a seed drawn and printed once per process), each block in one of two ways, a coin flip per
// block: any ready thread of any warp (fine interleavings), or by a random priority of the roles
// (the warpgroups of a block of two or more, else its warps), drawn anew at each barrier
// completion, so that a role runs ahead of or lags behind the others for long stretches (a role
// that reads before its producer is done must run first right after a hand-over; any-thread picks
// almost never keep a role of 4 warps ahead of 8 others). Random schedules also yield with
// probability 1/2 at the preemption points: after a bar.arrive, at cp_async_wait,
// fence_proxy_async_shared and after wgmma_commit, where a producer's writes and its hand-over
// meet, so that other roles run in between (each thread on its own coin; by priority, the role as
// one, which then goes last).
// What it checks: each kernel's indexing, fragment layouts and descriptors, barriers placed so
// that a thread never waits forever (a deadlock throws, naming where the threads wait), outputs
// written where they belong (the tests poison outputs and shared memory); for wgmma, that its
// shared-memory operands and its accumulator registers are left alone until the wait that
// completes it, and that no warpgroup exits with a product in flight; for named barriers, that a
// warp does not arrive at a phase twice (named_barrier). Under random schedules, hand-overs
// between roles: a role that reads a buffer before its producer's barrier, or writes one before
// its consumers are done, reads poison or stale data (wrong results) or changes a wgmma operand
// in flight (throws) under some of the schedules.
// What it does not: timing; races that no schedule shows, since a fiber only yields where listed
// above (a race between two plain stores or loads of one barrier phase shows only when a
// collective or a preemption point falls between them), and each race only under the schedules
// that interleave it (run several seeds); the memory model (every store is visible to every
// thread at once: a missing fence or a barrier that orders no memory passes); the proxy fences
// (fence_proxy_async_shared, wgmma_fence: the order they guard is the fibers' program order
// here); swizzled wgmma layouts, register budgets
// (setmaxnreg is a no-op), warps with exited lanes at a named barrier (the GPU counts the warp;
// here its lanes never meet: a deadlock), bitwise equality with the GPU (products are summed in
// another order, __expf is exact).
//
// Include this before any kernel header; build with CAKE_EMULATE defined (common/ptx.cuh then
// takes its instructions from emu/ptx.hpp).
#pragma once

#include <cuda_bf16.h>
#include <vector_functions.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <type_traits>

#define __CUDA_ARCH__ 900  // the kernels' bodies are guarded by it
#define __launch_bounds__(...)

namespace cake::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// The running fiber's coordinates.
Dim3 const& thread_idx();
Dim3 const& block_idx();
Dim3 const& block_dim();
Dim3 const& grid_dim();

// Runs `body` as every thread of every block of `grid`, blocks in order (x fastest). Before each
// block, `shared` (the kernel's dynamic shared memory) is filled with 0xff bytes (NaN as fp32 and
// bf16), so that reading what the block did not write shows. Throws std::runtime_error on a
// deadlock (threads waiting at different barriers, a named barrier that cannot complete, a warp
// or warpgroup collective a thread never reaches), on a warpgroup ending with wgmma in flight, on
// a warp arriving at a named barrier twice in one phase, and with what an emulated instruction
// throws (a wgmma operand changed before its wait, ...). The threads run in the order of the
// schedule (set_schedule).
void launch(Dim3 grid, Dim3 block, std::span<char> shared, std::function<void()> const& body);

// The emulated device's SM count, cudaDeviceGetAttribute's cudaDevAttrMultiProcessorCount (132,
// an H100's, until set): the ops pick the forms of their stages by it (ops/cuda/stages.hpp,
// reverse_form) and the forward walk's launch its split (walk_a_fwd/split.hpp), so that a test
// can run either.
void set_multiprocessor_count(int count);
// set_multiprocessor_count for one scope: an H100's 132 again when it ends, by return or throw.
struct ScopedMultiprocessorCount {
  explicit ScopedMultiprocessorCount(int count) { set_multiprocessor_count(count); }
  ~ScopedMultiprocessorCount() { set_multiprocessor_count(132); }
  ScopedMultiprocessorCount(ScopedMultiprocessorCount const&) = delete;
  ScopedMultiprocessorCount& operator=(ScopedMultiprocessorCount const&) = delete;
};

// __syncthreads: waits for every thread of the block that has not exited.
void sync_block();

// bar.sync (wait) / bar.arrive (!wait) id, num_threads: barrier `id` (0 .. 15; its state is
// apart from __syncthreads's) completes once num_threads threads (a multiple of 32) have arrived,
// and is then reset for its next phase. The warp's 32 lanes meet first and arrive as one warp, as
// on the GPU; a sync then waits for the completion; an arrive is a preemption point. Every
// arrival at one phase names the same num_threads.
// Phases: the GPU keeps one arrival count per barrier, not one per phase (PTX ISA, "bar,
// barrier": a barrier completes when the count is reached, "and the barrier is reinitialized so
// that it can be immediately reused"), so a warp's bar.arrive for phase k + 1 while phase k is
// incomplete is counted in phase k: it completes that phase with some warp it was meant to wait
// for missing (whose arrival then counts in phase k + 1), and every hand-over after it is off by
// one. PTX makes avoiding it the program's duty ("Care must be taken to keep a warp from
// executing more barrier{.cta} instructions than intended (barrier{.cta}.arrive followed by any
// other barrier{.cta} instruction to the same barrier) prior to the reset of the barrier"; its
// outcome is not specified further). So the emulator throws
// when a warp arrives at a barrier a second time before the phase it arrived at completed (a
// warp's bar.sync cannot: it waits for the completion), naming the barrier and the warp, rather
// than count it as the GPU would: the GPU's outcome would be wrong values or a hang under some
// timings only, where the throw points at the cause under every schedule that shows it.
void named_barrier(int id, int num_threads, bool wait);

// The seed of the process's schedules: CAKE_EMU_SEED (a decimal 64-bit integer; throws
// std::invalid_argument if it is not one) if set, else drawn from std::random_device (never 0) and
// printed to stderr once, as "cake emu: schedule seed N", so that a failure can be replayed with
// CAKE_EMU_SEED=N. 0 is the fixed order: ready fibers in thread order, round robin, no
// preemption.
uint64_t schedule_seed();

// Restarts the schedule: with seed 0 the fixed order, else a random one drawn from seed and
// `stream` (the emulated tests restart it at each test from schedule_seed() and the test's name,
// so that one test replays alone with the seed of a whole run). Until first called, the schedule
// is schedule_seed()'s.
void set_schedule(uint64_t seed, uint64_t stream = 0);

// Under a random schedule, yields with probability 1/2 (the thread's coin, or its role's at its
// n-th preemption point, the role then going last): the running fiber stays ready, and the
// scheduler may run others first. Nothing under the fixed order.
void preemption_point();

// cp.async, landing late as on the GPU: a copy reads its source at issue and writes its
// destination only when a cp.async.wait_group completes its group; at issue the destination is
// filled with 0xff bytes (NaN as fp32 and bf16), so that a thread reading it before the wait (and
// its barrier), or a copy issued into a buffer that another role still reads, shows as wrong
// values. Groups are the calling thread's, as on the GPU: commit closes the open group (an empty
// one too), wait(pending) lands every committed group but the `pending` newest and is a
// preemption point. Copies a thread never waits for are dropped at the end of its block.
void cp_async_issue(void* smem, void const* gmem, int bytes, bool valid);
void cp_async_commit_group();
void cp_async_wait_group(int pending);

// mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier"): an
// object in shared memory with an expected arrival count, the arrivals pending in the current
// phase and a transaction count (bytes); the phase completes when both reach zero, then the next
// begins with the arrivals reset to the count. Phases alternate parity 0, 1, 0, ... from init.
// The emulator keeps the state beside the block, keyed by the barrier's shared address:
// - mbarrier_init(bar, count): a new barrier (count > 0), phase 0;
// - mbarrier_arrive(bar, tx): one arrival, after adding tx expected bytes (mbarrier.arrive
//   .expect_tx; tx = 0 for a plain arrive); throws on an arrival beyond the count in a phase;
//   a preemption point;
// - mbarrier_wait(bar, parity): returns once the phase of that parity has completed (the current
//   phase has the other parity), else the fiber waits (mbarrier.try_wait.parity in a loop).
// Bulk copies (cp.async.bulk, .tensor): bulk_copy_issue(dst, src bytes, bar) reads the source at
// issue, fills the destination with 0xff bytes, and lands it (writes it, then completes its bytes
// on the barrier) when a thread waits on that barrier, or at issue if one already waits: reading
// the destination before the barrier's phase completes shows, as with cp.async. A deadlock message
// names each barrier with waiters.
void mbarrier_init(void* bar, int count);
void mbarrier_arrive(void* bar, uint32_t tx_bytes);
void mbarrier_wait(void* bar, int parity);
void bulk_copy_issue(void* dst, std::span<char const> bytes, void* bar);

// Bulk stores (cp.async.bulk.tensor, shared -> global): bulk_store_issue(read) records a store
// the calling thread issued; read() reads its shared source and returns the write of those bytes
// to global memory. Both happen as late as the GPU allows: the read at the first wait whose
// group count covers the store (cp.async.bulk.wait_group.read or wait_group), so that a thread
// that rewrites the source before that wait (and barrier) stores the new bytes (wrong results);
// the write at a wait_group (reads_only false) alone. Groups are the calling thread's: commit
// closes the open group, wait(pending, reads_only) covers every committed group but the
// `pending` newest and is a preemption point. A thread that exits with a store not written
// (never waited for, or only by wait_group.read) throws: its writes were never made complete.
using BulkStoreWrite = std::function<void()>;
void bulk_store_issue(std::function<BulkStoreWrite()> read);
void bulk_store_commit_group();
void bulk_store_wait_group(int pending, bool reads_only);

// Shared memory: the buffer given to launch() is the block's shared window, its first byte at
// shared address 0, as `extern __shared__` buffers are in the emulated kernels (launch_emu.cpp).
// shared_address(p) is __cvta_generic_to_shared (throws unless p is in the buffer), so that the
// addresses the kernels put in wgmma descriptors resolve back into the buffer (shared_memory()).
uint32_t shared_address(void const* p);
std::span<char> shared_memory();

// The warp's 32 lanes meet: lane l contributes in[l]; once all have arrived, the last one runs
// op(in, out) over the 32 inputs, and lane l continues with out[l]. `tag` names the operation,
// so that lanes at different collectives are reported instead of mixed.
void warp_meet_bytes(void const* in, size_t in_size, void* out, size_t out_size,
                     void (*op)(void const* in, void* out), char const* tag);

// The same for the warpgroup's 128 threads (warps 4 g .. 4 g + 3; the block must be whole
// warpgroups): thread t % 128 contributes in[t % 128]. wgmma and its fence / commit / wait.
void warpgroup_meet_bytes(void const* in, size_t in_size, void* out, size_t out_size,
                          void (*op)(void const* in, void* out), char const* tag);

// The running thread's warpgroup's slot for the asynchronous operations it has in flight
// (emu/wgmma.cpp keeps its wgmma groups there, and empties the slot when none is in flight). Empty
// at the start of each block; a block that ends with a slot not empty throws.
std::shared_ptr<void>& warpgroup_async_state();

template <class In, class Out>
Out warp_meet(In const& in, void (*op)(void const* in, void* out), char const* tag) {
  static_assert(std::is_trivially_copyable_v<In> && std::is_trivially_copyable_v<Out>);
  Out out;
  warp_meet_bytes(&in, sizeof(In), &out, sizeof(Out), op, tag);
  return out;
}

// Shuffles and ballot over a full warp (the kernels always pass the full mask).
enum ShflKind { kIdx, kXor, kDown, kUp };

template <class T, ShflKind kKind>
struct Shfl {
  struct In {
    T x;
    int arg;
  };
  static void op(void const* in_v, void* out_v) {
    auto const* in = static_cast<In const*>(in_v);
    auto* out = static_cast<T*>(out_v);
    for (int l = 0; l < 32; ++l) {
      int const a = in[l].arg;
      int src = l;
      if constexpr (kKind == kIdx) src = a & 31;
      if constexpr (kKind == kXor) src = l ^ a;
      if constexpr (kKind == kDown) src = l + a < 32 ? l + a : l;
      if constexpr (kKind == kUp) src = l - a >= 0 ? l - a : l;
      out[l] = in[src].x;
    }
  }
  static T run(T x, int arg) { return warp_meet<In, T>(In{x, arg}, &op, "shfl"); }
};

inline unsigned ballot(bool pred) {
  return warp_meet<int, unsigned>(pred ? 1 : 0, [](void const* in_v, void* out_v) {
    auto const* in = static_cast<int const*>(in_v);
    unsigned bits = 0;
    for (int l = 0; l < 32; ++l) bits |= in[l] != 0 ? 1u << l : 0u;
    for (int l = 0; l < 32; ++l) static_cast<unsigned*>(out_v)[l] = bits;
  }, "ballot");
}

inline void sync_warp() {
  warp_meet<int, int>(0, [](void const*, void* out_v) {
    std::memset(out_v, 0, 32 * sizeof(int));
  }, "syncwarp");
}

}  // namespace cake::emu

#define threadIdx (::cake::emu::thread_idx())
#define blockIdx (::cake::emu::block_idx())
#define blockDim (::cake::emu::block_dim())
#define gridDim (::cake::emu::grid_dim())

inline void __syncthreads() { ::cake::emu::sync_block(); }
inline size_t __cvta_generic_to_shared(void const* p) { return ::cake::emu::shared_address(p); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::cake::emu::sync_warp(); }

template <class T>
T __shfl_sync(unsigned, T x, int src) {
  return ::cake::emu::Shfl<T, ::cake::emu::kIdx>::run(x, src);
}
template <class T>
T __shfl_xor_sync(unsigned, T x, int mask) {
  return ::cake::emu::Shfl<T, ::cake::emu::kXor>::run(x, mask);
}
template <class T>
T __shfl_down_sync(unsigned, T x, unsigned delta) {
  return ::cake::emu::Shfl<T, ::cake::emu::kDown>::run(x, static_cast<int>(delta));
}
template <class T>
T __shfl_up_sync(unsigned, T x, unsigned delta) {
  return ::cake::emu::Shfl<T, ::cake::emu::kUp>::run(x, static_cast<int>(delta));
}
inline unsigned __ballot_sync(unsigned, int pred) { return ::cake::emu::ballot(pred != 0); }

// Math intrinsics, exact on the CPU (the GPU's __expf and __fdividef are approximations: results
// differ in the last bits, well inside the accuracy gate).
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
inline unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
