// The emulator's scheduler (runtime.hpp says what it models): one fiber per CUDA thread, run
// cooperatively; a fiber runs until it meets a barrier or a warp collective, then yields.
#include "emu/runtime.hpp"

#include <sys/mman.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

// Fiber switches: a kernel block meets ~10^5-10^6 times, so they must be cheap. swapcontext saves
// the signal mask with a system call each time; this saves only what the x86-64 System V ABI
// makes the callee preserve (rbx, rbp, r12-r15, and the stack pointer).
//   cake_emu_switch(void** save_sp, void* load_sp): pushes the six registers, stores rsp in
//   *save_sp, loads rsp = load_sp, pops six registers, returns into the other context.
#if !defined(__x86_64__)
#error "the kernel emulator's fiber switch is written for x86-64"
#endif
asm(R"(
  .text
  .globl cake_emu_switch
  .type cake_emu_switch, @function
cake_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cake_emu_switch, .-cake_emu_switch
)");
extern "C" void cake_emu_switch(void** save_sp, void* load_sp);

namespace cake::emu {

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 4096;  // an inaccessible page below each stack: overflow faults
constexpr size_t kMeetBytes = 128;    // the largest per-thread input or output of a collective
constexpr int kNamedBarriers = 16;    // bar.sync / bar.arrive ids 0 .. 15

struct Fiber {
  void* sp = nullptr;  // the saved stack pointer while the fiber is switched out
  char* stack = nullptr;  // kGuardBytes of guard, then kStackBytes
  Dim3 thread_idx;
  bool done = false;
  // What the fiber waits for: a generation of the block barrier, of its warp's or warpgroup's
  // meeting, or of named barrier `wait_barrier` to pass; or nothing.
  enum Wait { kRunnable, kBlock, kWarp, kWarpgroup, kBarrier } wait = kRunnable;
  uint64_t wait_generation = 0;
  int wait_barrier = 0;
};

// A collective of `threads` threads (a warp or a warpgroup): each contributes its input at
// in[rank * in_size]; the last to arrive runs op over them, each continues with its output at
// out[rank * out_size].
struct Meeting {
  int arrived = 0;
  uint64_t generation = 0;
  char const* tag = nullptr;
  void (*op)(void const*, void*) = nullptr;
  size_t in_size = 0, out_size = 0;
  std::vector<char> in, out;  // threads x kMeetBytes

  explicit Meeting(int threads) : in(threads * kMeetBytes), out(threads * kMeetBytes) {}
};

struct NamedBarrier {
  int arrived = 0;   // threads, in whole warps
  int expected = 0;  // the count the phase's first arrival named
  uint64_t generation = 0;
};

struct Block {
  Dim3 grid, block_dim, block_idx;
  std::span<char> shared;
  std::vector<Fiber> fibers;
  std::vector<Meeting> warps, warpgroups;
  std::vector<std::shared_ptr<void>> async_state;  // one slot per warpgroup
  NamedBarrier barriers[kNamedBarriers];
  int arrived = 0;  // at the block barrier
  uint64_t generation = 0;
  int done = 0;
  void* scheduler_sp = nullptr;
  Fiber* current = nullptr;
  std::function<void()> const* body = nullptr;
  std::exception_ptr error;  // thrown inside a fiber; rethrown by the scheduler
};

Block* g_block = nullptr;

int num_threads(Dim3 const& d) { return static_cast<int>(d.x * d.y * d.z); }

int linear_tid(Fiber const& f) {
  Dim3 const& d = g_block->block_dim;
  return static_cast<int>(f.thread_idx.x + d.x * (f.thread_idx.y + d.y * f.thread_idx.z));
}

// Exceptions cannot unwind across contexts: a fiber's is kept and rethrown by the scheduler.
void fiber_entry() {
  try {
    (*g_block->body)();
  } catch (...) {
    g_block->error = std::current_exception();
  }
  g_block->current->done = true;
  ++g_block->done;
  cake_emu_switch(&g_block->current->sp, g_block->scheduler_sp);  // never switched back to
}

// A new fiber's stack, so that the first switch to it "returns" into fiber_entry: six zero
// registers, then fiber_entry's address; rsp is 8 mod 16 on entry, as after a call.
void* initial_stack(char* stack_top) {
  auto* top = reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(stack_top) & ~uintptr_t{15});
  *--top = 0;  // fiber_entry's would-be return address (it never returns): rsp = 8 mod 16
  *--top = reinterpret_cast<uintptr_t>(&fiber_entry);
  for (int r = 0; r < 6; ++r) *--top = 0;
  return top;
}

// Yields to the scheduler until the fiber's wait is over.
void yield_until(Fiber::Wait wait, uint64_t generation, int barrier = 0) {
  Fiber* const f = g_block->current;
  f->wait = wait;
  f->wait_generation = generation;
  f->wait_barrier = barrier;
  cake_emu_switch(&f->sp, g_block->scheduler_sp);
}

bool runnable(Fiber const& f) {
  switch (f.wait) {
    case Fiber::kRunnable:
      return true;
    case Fiber::kBlock:
      return g_block->generation != f.wait_generation;
    case Fiber::kWarp:
      return g_block->warps[linear_tid(f) / 32].generation != f.wait_generation;
    case Fiber::kWarpgroup:
      return g_block->warpgroups[linear_tid(f) / 128].generation != f.wait_generation;
    case Fiber::kBarrier:
      return g_block->barriers[f.wait_barrier].generation != f.wait_generation;
  }
  return false;
}

// The block barrier completes when every thread that has not exited has arrived.
void maybe_release_block() {
  if (g_block->arrived > 0 &&
      g_block->arrived + g_block->done == num_threads(g_block->block_dim)) {
    g_block->arrived = 0;
    ++g_block->generation;
  }
}

std::string block_name(Block const& b) {
  return "block (" + std::to_string(b.block_idx.x) + ", " + std::to_string(b.block_idx.y) + ")";
}

// Where the block's threads wait, for a deadlock's message.
std::string waiting(Block const& b) {
  std::string what = std::to_string(b.arrived) + " threads at __syncthreads, " +
                     std::to_string(b.done) + " exited";
  for (int id = 0; id < kNamedBarriers; ++id)
    if (b.barriers[id].arrived > 0)
      what += ", named barrier " + std::to_string(id) + ": " +
              std::to_string(b.barriers[id].arrived) + " of " +
              std::to_string(b.barriers[id].expected) + " threads arrived";
  for (size_t w = 0; w < b.warps.size(); ++w)
    if (b.warps[w].arrived > 0)
      what += ", warp " + std::to_string(w) + ": " + std::to_string(b.warps[w].arrived) +
              " lanes at " + b.warps[w].tag;
  for (size_t g = 0; g < b.warpgroups.size(); ++g)
    if (b.warpgroups[g].arrived > 0)
      what += ", warpgroup " + std::to_string(g) + ": " + std::to_string(b.warpgroups[g].arrived) +
              " threads at " + b.warpgroups[g].tag;
  return what;
}

void run_block() {
  Block& b = *g_block;
  int const n = num_threads(b.block_dim);
  for (int t = 0; t < n; ++t) {
    Fiber& f = b.fibers[t];
    f.done = false;
    f.wait = Fiber::kRunnable;
    f.thread_idx = Dim3{t % b.block_dim.x, t / b.block_dim.x % b.block_dim.y,
                        t / (b.block_dim.x * b.block_dim.y)};
    f.sp = initial_stack(f.stack + kGuardBytes + kStackBytes);
  }
  for (Meeting& w : b.warps) w.arrived = 0;
  for (Meeting& g : b.warpgroups) g.arrived = 0;
  for (auto& state : b.async_state) state.reset();
  for (NamedBarrier& bar : b.barriers) bar.arrived = 0;
  b.arrived = 0;
  b.done = 0;
  while (b.done < n) {
    bool progress = false;
    for (int t = 0; t < n; ++t) {
      Fiber& f = b.fibers[t];
      if (f.done || !runnable(f)) continue;
      f.wait = Fiber::kRunnable;
      b.current = &f;
      cake_emu_switch(&b.scheduler_sp, f.sp);
      if (b.error) std::rethrow_exception(b.error);
      progress = true;
      maybe_release_block();  // a thread that exited may complete a barrier the others wait at
    }
    if (!progress)
      throw std::runtime_error("emulator deadlock in " + block_name(b) + ": " + waiting(b));
  }
  for (size_t g = 0; g < b.async_state.size(); ++g)
    if (b.async_state[g])
      throw std::runtime_error("emulator: warpgroup " + std::to_string(g) + " of " + block_name(b) +
                               " exited with asynchronous operations in flight (wgmma not "
                               "completed by a wgmma_wait)");
}

// The calling thread's part in `m`, the meeting of `threads` threads (`kind` number `index`: a
// warp or a warpgroup) of which it is `rank`.
void meet(Meeting& m, int threads, int rank, char const* kind, int index, Fiber::Wait wait,
          void const* in, size_t in_size, void* out, size_t out_size,
          void (*op)(void const*, void*), char const* tag) {
  if (in_size > kMeetBytes || out_size > kMeetBytes)
    throw std::logic_error("emulator: a collective's operands exceed kMeetBytes");
  if (m.arrived == 0) {
    m.tag = tag;
    m.op = op;
    m.in_size = in_size;
    m.out_size = out_size;
  } else if (m.op != op || m.in_size != in_size || m.out_size != out_size) {
    throw std::runtime_error(std::string("emulator: threads of ") + kind + " " +
                             std::to_string(index) + " meet at different collectives (" + m.tag +
                             ", " + tag + ")");
  }
  std::memcpy(m.in.data() + rank * in_size, in, in_size);
  uint64_t const generation = m.generation;
  if (++m.arrived == threads) {
    op(m.in.data(), m.out.data());
    m.arrived = 0;
    ++m.generation;
  } else {
    yield_until(wait, generation);
  }
  std::memcpy(out, m.out.data() + rank * out_size, out_size);
}

struct BarrierArrival {
  int id, num_threads, wait;
  bool operator==(BarrierArrival const&) const = default;
};

char const* barrier_name(BarrierArrival const& a) { return a.wait ? "bar.sync" : "bar.arrive"; }

// The warp's arrival at a named barrier, once its 32 lanes have met there: every lane gets the
// barrier's generation before the arrival (the phase a sync waits to pass).
void barrier_arrival_op(void const* in_v, void* out_v) {
  auto const* in = static_cast<BarrierArrival const*>(in_v);
  int const warp = linear_tid(*g_block->current) / 32;
  for (int l = 1; l < 32; ++l)
    if (!(in[l] == in[0]))
      throw std::runtime_error("emulator: lanes of warp " + std::to_string(warp) +
                               " at different barriers (" + barrier_name(in[0]) + " " +
                               std::to_string(in[0].id) + ", " + std::to_string(in[0].num_threads) +
                               " and " + barrier_name(in[l]) + " " + std::to_string(in[l].id) +
                               ", " + std::to_string(in[l].num_threads) + ")");
  NamedBarrier& bar = g_block->barriers[in[0].id];
  if (bar.arrived == 0) {
    bar.expected = in[0].num_threads;
  } else if (bar.expected != in[0].num_threads) {
    throw std::runtime_error("emulator: named barrier " + std::to_string(in[0].id) + ": warp " +
                             std::to_string(warp) + " arrives for " +
                             std::to_string(in[0].num_threads) + " threads, others for " +
                             std::to_string(bar.expected));
  }
  auto* out = static_cast<uint64_t*>(out_v);
  for (int l = 0; l < 32; ++l) out[l] = bar.generation;
  bar.arrived += 32;
  if (bar.arrived == bar.expected) {
    bar.arrived = 0;
    ++bar.generation;
  }
}

}  // namespace

Dim3 const& thread_idx() { return g_block->current->thread_idx; }
Dim3 const& block_idx() { return g_block->block_idx; }
Dim3 const& block_dim() { return g_block->block_dim; }
Dim3 const& grid_dim() { return g_block->grid; }

void sync_block() {
  Block& b = *g_block;
  uint64_t const generation = b.generation;
  ++b.arrived;
  maybe_release_block();
  if (b.generation == generation) yield_until(Fiber::kBlock, generation);
}

void named_barrier(int id, int threads, bool wait) {
  Block& b = *g_block;
  if (id < 0 || id >= kNamedBarriers)
    throw std::runtime_error("emulator: named barrier id " + std::to_string(id) +
                             " outside 0 .. 15");
  if (threads <= 0 || threads % 32 != 0 || threads > num_threads(b.block_dim))
    throw std::runtime_error("emulator: named barrier " + std::to_string(id) + " for " +
                             std::to_string(threads) +
                             " threads: not a positive multiple of 32 up to the block's " +
                             std::to_string(num_threads(b.block_dim)));
  BarrierArrival const arrival{id, threads, wait ? 1 : 0};
  uint64_t const generation =
      warp_meet<BarrierArrival, uint64_t>(arrival, &barrier_arrival_op, barrier_name(arrival));
  if (wait && b.barriers[id].generation == generation) yield_until(Fiber::kBarrier, generation, id);
}

uint32_t shared_address(void const* p) {
  std::span<char> const shared = g_block->shared;
  auto const* c = static_cast<char const*>(p);
  if (shared.empty() || c < shared.data() || c >= shared.data() + shared.size())
    throw std::runtime_error(
        "emulator: __cvta_generic_to_shared of an address outside the block's shared memory (the "
        "buffer given to launch)");
  return static_cast<uint32_t>(c - shared.data());
}

std::span<char> shared_memory() { return g_block->shared; }

void warp_meet_bytes(void const* in, size_t in_size, void* out, size_t out_size,
                     void (*op)(void const*, void*), char const* tag) {
  Block& b = *g_block;
  int const tid = linear_tid(*b.current);
  meet(b.warps[tid / 32], 32, tid % 32, "warp", tid / 32, Fiber::kWarp, in, in_size, out, out_size,
       op, tag);
}

void warpgroup_meet_bytes(void const* in, size_t in_size, void* out, size_t out_size,
                          void (*op)(void const*, void*), char const* tag) {
  Block& b = *g_block;
  int const tid = linear_tid(*b.current);
  if (static_cast<size_t>(tid / 128) >= b.warpgroups.size())
    throw std::runtime_error(std::string("emulator: ") + tag + " in a block of " +
                             std::to_string(num_threads(b.block_dim)) +
                             " threads, not whole warpgroups of 128");
  meet(b.warpgroups[tid / 128], 128, tid % 128, "warpgroup", tid / 128, Fiber::kWarpgroup, in,
       in_size, out, out_size, op, tag);
}

std::shared_ptr<void>& warpgroup_async_state() {
  return g_block->async_state[linear_tid(*g_block->current) / 128];
}

void launch(Dim3 grid, Dim3 block_dim, std::span<char> shared, std::function<void()> const& body) {
  int const n = num_threads(block_dim);
  if (n % 32 != 0) throw std::logic_error("emulator: blocks are whole warps");
  Block b;
  b.grid = grid;
  b.block_dim = block_dim;
  b.shared = shared;
  b.body = &body;
  b.fibers.resize(n);
  b.warps.assign(n / 32, Meeting(32));
  b.warpgroups.assign(n / 128, Meeting(128));
  b.async_state.resize(n / 128);
  for (Fiber& f : b.fibers) {
    void* const mem = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) throw std::runtime_error("emulator: no memory for fiber stacks");
    mprotect(mem, kGuardBytes, PROT_NONE);
    f.stack = static_cast<char*>(mem);
  }
  g_block = &b;
  try {
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          b.block_idx = Dim3{x, y, z};
          if (!shared.empty()) std::memset(shared.data(), 0xff, shared.size());
          run_block();
        }
  } catch (...) {
    g_block = nullptr;
    for (Fiber& f : b.fibers) munmap(f.stack, kGuardBytes + kStackBytes);
    throw;
  }
  g_block = nullptr;
  for (Fiber& f : b.fibers) munmap(f.stack, kGuardBytes + kStackBytes);
}

}  // namespace cake::emu
