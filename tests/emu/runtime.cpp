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
constexpr size_t kMeetBytes = 128;    // the largest per-lane input or output of a collective

struct Fiber {
  void* sp = nullptr;  // the saved stack pointer while the fiber is switched out
  char* stack = nullptr;  // kGuardBytes of guard, then kStackBytes
  Dim3 thread_idx;
  bool done = false;
  // What the fiber waits for: a barrier generation to pass (block or warp), or nothing.
  enum Wait { kRunnable, kBlock, kWarp } wait = kRunnable;
  uint64_t wait_generation = 0;
};

struct Warp {
  int arrived = 0;
  uint64_t generation = 0;
  char const* tag = nullptr;
  void (*op)(void const*, void*) = nullptr;
  size_t in_size = 0, out_size = 0;
  alignas(16) char in[32][kMeetBytes];
  alignas(16) char out[32][kMeetBytes];
};

struct Block {
  Dim3 grid, block_dim, block_idx;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
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
void yield_until(Fiber::Wait wait, uint64_t generation) {
  Fiber* const f = g_block->current;
  f->wait = wait;
  f->wait_generation = generation;
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
  for (Warp& w : b.warps) w.arrived = 0;
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
    if (!progress) {
      std::string what = "emulator deadlock in block (" + std::to_string(b.block_idx.x) + ", " +
                         std::to_string(b.block_idx.y) + "): ";
      what += std::to_string(b.arrived) + " threads at __syncthreads, " +
              std::to_string(b.done) + " exited";
      for (size_t w = 0; w < b.warps.size(); ++w)
        if (b.warps[w].arrived > 0)
          what += ", warp " + std::to_string(w) + ": " + std::to_string(b.warps[w].arrived) +
                  " lanes at " + b.warps[w].tag;
      throw std::runtime_error(what);
    }
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

void warp_meet_bytes(void const* in, size_t in_size, void* out, size_t out_size,
                     void (*op)(void const*, void*), char const* tag) {
  if (in_size > kMeetBytes || out_size > kMeetBytes)
    throw std::logic_error("emulator: a collective's operands exceed kMeetBytes");
  Block& b = *g_block;
  int const tid = linear_tid(*b.current);
  Warp& w = b.warps[tid / 32];
  int const lane = tid % 32;
  if (w.arrived == 0) {
    w.tag = tag;
    w.op = op;
    w.in_size = in_size;
    w.out_size = out_size;
  } else if (w.op != op || w.in_size != in_size) {
    throw std::runtime_error(std::string("emulator: lanes of warp ") + std::to_string(tid / 32) +
                             " meet at different collectives (" + w.tag + ", " + tag + ")");
  }
  std::memcpy(w.in[lane], in, in_size);
  uint64_t const generation = w.generation;
  if (++w.arrived == 32) {
    // Gather the 32 inputs and scatter the outputs contiguously for op, then back to the slots.
    alignas(16) char ins[32 * kMeetBytes];
    alignas(16) char outs[32 * kMeetBytes];
    for (int l = 0; l < 32; ++l) std::memcpy(ins + l * in_size, w.in[l], in_size);
    op(ins, outs);
    for (int l = 0; l < 32; ++l) std::memcpy(w.out[l], outs + l * out_size, out_size);
    w.arrived = 0;
    ++w.generation;
  } else {
    yield_until(Fiber::kWarp, generation);
  }
  std::memcpy(out, w.out[lane], out_size);
}

void launch(Dim3 grid, Dim3 block_dim, std::span<char> shared, std::function<void()> const& body) {
  int const n = num_threads(block_dim);
  if (n % 32 != 0) throw std::logic_error("emulator: blocks are whole warps");
  Block b;
  b.grid = grid;
  b.block_dim = block_dim;
  b.body = &body;
  b.fibers.resize(n);
  b.warps.resize(n / 32);
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
