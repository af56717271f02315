// The emulator's scheduler (runtime.hpp says what it models): one fiber per CUDA thread, run
// cooperatively; a fiber runs until it meets a barrier or a warp collective (or yields at a
// preemption point), and the scheduler then picks the next from those ready, in thread order or
// at random (set_schedule).
#include "emu/runtime.hpp"

#include <sys/mman.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <random>
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
constexpr int kMaxThreads = 1024;     // CUDA's largest block: 32 warps, one bit each below
// The stacks are page aligned; their tops are moved down by a cache line per fiber (64 fibers
// over a page), so that the fibers' hot frames, at the same depth in each stack, fall in
// different cache sets rather than all in the same few: unstaggered, the switches (their loads
// of the saved registers) took 3x as long in EmulatedGdn's forward test.
constexpr size_t kStaggerBytes = 64;
constexpr int kStaggers = 4096 / kStaggerBytes;

// A cp.async copy in flight: its source's bytes, read at issue, and where they land.
struct CpAsyncCopy {
  char* dst = nullptr;
  int bytes = 0;
  char data[16] = {};
};

// A bulk store in flight: the read of its source, and once read, the write of its bytes.
struct BulkStore {
  std::function<BulkStoreWrite()> read;
  BulkStoreWrite write;
};

// One thread's asynchronous operations of one kind (cp.async, bulk stores: each kind has its own
// groups on the GPU): those issued since the last commit, and the committed groups not yet waited
// for, oldest first.
template <class Op>
struct AsyncGroups {
  std::vector<Op> open;
  std::deque<std::vector<Op>> committed;
  void commit() {
    committed.push_back(std::move(open));
    open.clear();
  }
  // complete(op) for every operation of every committed group but the `pending` newest
  template <class Complete>
  void complete_all_but(int pending, Complete const& complete) {
    while (committed.size() > static_cast<size_t>(pending)) {
      for (Op const& op : committed.front()) complete(op);
      committed.pop_front();
    }
  }
  bool empty() const { return open.empty() && committed.empty(); }
  void clear() {
    open.clear();
    committed.clear();
  }
};

// A fiber waits by leaving the ready set; what it waits for (a meeting, a barrier) puts it back
// when it passes, so that picking the next fiber never polls the waiting ones.
struct Fiber {
  void* sp = nullptr;     // the saved stack pointer while the fiber is switched out
  char* stack = nullptr;  // kGuardBytes of guard, then kStackBytes
  Dim3 thread_idx;
  bool done = false;
  size_t points = 0;  // preemption points passed (Order::kPriority)
  AsyncGroups<CpAsyncCopy> copies;  // cp.async (cp_async_issue)
  AsyncGroups<BulkStore> stores;    // bulk stores (bulk_store_issue)
};

// A collective of `threads` threads (a warp or a warpgroup): each contributes its input at
// in[rank * in_size]; the last to arrive runs op over them, each continues with its output at
// out[rank * out_size].
struct Meeting {
  int arrived = 0;
  char const* tag = nullptr;
  void (*op)(void const*, void*) = nullptr;
  size_t in_size = 0, out_size = 0;
  std::vector<char> in, out;  // threads x kMeetBytes
  explicit Meeting(int threads) : in(threads * kMeetBytes), out(threads * kMeetBytes) {}
};

struct NamedBarrier {
  int arrived = 0;     // threads, in whole warps
  int expected = 0;    // the count the phase's first arrival named
  uint32_t warps = 0;  // bit w: warp w has arrived in this phase
  uint64_t generation = 0;
  std::vector<int> waiting;  // the fibers whose bar.sync waits for this phase
};

// A bulk copy in flight: its source's bytes, read at issue, and where they land.
struct BulkCopy {
  char* dst = nullptr;
  std::vector<char> data;
};

// An mbarrier's state (runtime.hpp): arrivals pending in the phase, transaction bytes expected
// and not completed (negative while copies have landed before their expect_tx), the phase, the
// fibers waiting for it to complete and the copies that complete bytes on it.
struct Mbarrier {
  int count = 0;
  int pending = 0;
  int64_t tx = 0;
  uint64_t phase = 0;
  std::vector<int> waiting;
  std::vector<BulkCopy> copies;
};

// The random bits of a schedule, drawn from a seed.
class Randomness {
 public:
  void restart(uint64_t seed, uint64_t stream) {
    std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                      static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
    rng_.seed(seq);
    left_ = 0;
  }
  // k <= 32 random bits, from a reservoir of unused ones (a pick takes 16 or 32, a coin flip 1).
  uint32_t bits(int k) {
    if (left_ < k) {
      reservoir_ = rng_();
      left_ = 64;
    }
    auto const out = static_cast<uint32_t>(reservoir_ & ((uint64_t{1} << k) - 1));
    reservoir_ >>= k;
    left_ -= k;
    return out;
  }
  // Uniform in [0, n) from 32 random bits (the bias, under n / 2^32, is immaterial).
  int below(int n) {
    return static_cast<int>((uint64_t{bits(32)} * static_cast<uint32_t>(n)) >> 32);
  }

 private:
  std::mt19937_64 rng_;
  uint64_t reservoir_ = 0;
  int left_ = 0;
};

// How a block's scheduler picks the next fiber from those ready.
enum class Order {
  kFixed,     // seed 0: the first after the last one run, in thread order (round robin)
  kAny,       // a random warp with ready threads, a random one of them
  kPriority,  // the role first in a random order of the block's roles (warpgroups, or warps in a
              // block of one warpgroup), then as kAny within it; the order is drawn anew whenever
              // a barrier completes, and a role that yields at a preemption point goes last. So
              // roles run ahead of each other for long stretches, which kAny almost never does
              // (a role must then win every pick of a stretch)
};

// A set bit of `mask` (not 0), uniformly from r (16 random bits). (Rotating the mask by r and
// taking the first bit is cheaper but favours the bit after the widest gap: the lowest of a warp's
// remaining lanes, or warp 0 of two, nearly always.)
int pick_bit(uint32_t mask, uint32_t r) {
  for (int k = static_cast<int>(r * std::popcount(mask) >> 16); k > 0; --k) mask &= mask - 1;
  return std::countr_zero(mask);
}

// The fibers ready to run, a bit per thread in a word per warp, with a bit per warp that has any
// ready and one per role that has any (by priority), so that each order picks in a few word
// operations. A warp's meeting makes 31 ready at once.
class ReadySet {
 public:
  void reset(int n) {
    int const warps = n / 32;
    lanes_.assign(warps, 0);
    warps_ = ranked_ = 0;
    count_ = 0;
    role_warps_ = warps >= 8 ? 4 : 1;
    role_at_.resize(warps / role_warps_);
    rank_.resize(warps / role_warps_);
    for (size_t r = 0; r < role_at_.size(); ++r) role_at_[r] = rank_[r] = static_cast<int>(r);
  }
  int count() const { return count_; }
  int roles() const { return static_cast<int>(role_at_.size()); }
  int role_of(int t) const { return t / 32 / role_warps_; }
  void add(int t) {
    int const w = t / 32;
    uint32_t const bit = uint32_t{1} << (t % 32);
    if (lanes_[w] & bit) throw std::logic_error("emulator: a fiber made ready twice");
    lanes_[w] |= bit;
    mark(w);
    ++count_;
  }
  // Fibers first .. first + n - 1 but `except`; first and n multiples of 32 (a warp or a
  // warpgroup).
  void add_range(int first, int n, int except) {
    for (int w = first / 32; w < (first + n) / 32; ++w) {
      uint32_t const bits = except / 32 == w ? ~(uint32_t{1} << (except % 32)) : ~uint32_t{0};
      if (lanes_[w] & bits) throw std::logic_error("emulator: a fiber made ready twice");
      lanes_[w] |= bits;
      mark(w);
    }
    count_ += n - 1;
  }
  // Order::kFixed: the first ready fiber after t in thread order, wrapping around to 0 (t itself
  // last). The take_ functions remove what they return; count() > 0.
  int take_next_after(int t) {
    int const warps = static_cast<int>(lanes_.size());
    int w = (t + 1) / 32;
    uint32_t bits = w < warps ? lanes_[w] & (~uint32_t{0} << ((t + 1) % 32)) : 0;
    while (bits == 0) {
      w = w + 1 < warps ? w + 1 : 0;
      bits = lanes_[w];
    }
    return take(w, std::countr_zero(bits));
  }
  // Order::kAny, from 32 random bits.
  int take_any(uint32_t r) { return take_in(warps_, r); }
  // Order::kPriority, from 32 random bits.
  int take_first(uint32_t r) {
    return take_in(warps_ & role_mask(role_at_[31 - std::countl_zero(ranked_)]), r);
  }
  // Order::kPriority: a new order of the roles.
  void shuffle(Randomness& random) {
    for (int i = roles() - 1; i > 0; --i) std::swap(role_at_[i], role_at_[random.below(i + 1)]);
    ranks_changed();
  }
  // Order::kPriority: role `role` goes last.
  void demote(int role) {
    for (int r = rank_[role]; r > 0; --r) role_at_[r] = role_at_[r - 1];
    role_at_[0] = role;
    ranks_changed();
  }

 private:
  uint32_t role_mask(int role) const {
    return static_cast<uint32_t>(((uint64_t{1} << role_warps_) - 1) << (role * role_warps_));
  }
  void mark(int w) {
    warps_ |= uint32_t{1} << w;
    ranked_ |= uint32_t{1} << rank_[w / role_warps_];
  }
  // A random ready thread of a random warp of `warps` (not 0).
  int take_in(uint32_t warps, uint32_t r) {
    int const w = pick_bit(warps, r & 0xffff);
    return take(w, pick_bit(lanes_[w], r >> 16));
  }
  int take(int w, int lane) {
    lanes_[w] &= ~(uint32_t{1} << lane);
    if (lanes_[w] == 0) {
      warps_ &= ~(uint32_t{1} << w);
      int const role = w / role_warps_;
      if ((warps_ & role_mask(role)) == 0) ranked_ &= ~(uint32_t{1} << rank_[role]);
    }
    --count_;
    return 32 * w + lane;
  }
  void ranks_changed() {
    ranked_ = 0;
    for (int r = 0; r < roles(); ++r) {
      rank_[role_at_[r]] = r;
      if ((warps_ & role_mask(role_at_[r])) != 0) ranked_ |= uint32_t{1} << r;
    }
  }

  std::vector<uint32_t> lanes_;  // bit l of lanes_[w]: thread 32 w + l is ready
  uint32_t warps_ = 0;           // bit w: lanes_[w] != 0
  int role_warps_ = 1;           // warps per role: 4 (warpgroups) in blocks of 8 warps or more
  uint32_t ranked_ = 0;          // bit rank_[role]: a warp of the role has ready threads
  std::vector<int> role_at_;     // the roles by priority, the first last
  std::vector<int> rank_;        // role r at role_at_[rank_[r]]
  int count_ = 0;
};

// The process's schedule: the fixed order (seed 0), or random ones, each block's drawn from the
// schedule's randomness: Order::kAny or Order::kPriority, a coin flip per block. Each catches
// what the other rarely does: kAny alone catches test_emu_schedule.cpp's lagging producer under
// none of its 20 seeds, nor did random picks of any thread show a bug planted in walk_a_fwd's
// warpgroup roles (the state roles arriving at kHbFull before writing h) under seeds 1-3, which
// the two together show under each of seeds 1-5.
struct Schedule {
  bool random = false;
  Randomness randomness;

  void restart(uint64_t seed, uint64_t stream) {
    random = seed != 0;
    randomness.restart(seed, stream);
  }
};

uint64_t seed_from_environment() {
  if (char const* text = std::getenv("CAKE_EMU_SEED")) {
    char* end = nullptr;
    errno = 0;
    unsigned long long const seed = std::strtoull(text, &end, 10);
    if (*text == '\0' || *end != '\0' || errno != 0 || *text == '-')
      throw std::invalid_argument(std::string("CAKE_EMU_SEED=") + text +
                                  ": not a seed (a decimal 64-bit unsigned integer)");
    return seed;
  }
  std::random_device device;
  uint64_t seed = 0;
  while (seed == 0) seed = uint64_t{device()} << 32 | device();
  std::fprintf(stderr, "cake emu: schedule seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

Schedule& schedule() {
  static Schedule s = [] {
    Schedule first;
    first.restart(schedule_seed(), 0);
    return first;
  }();
  return s;
}

struct Block {
  Dim3 grid, block_dim, block_idx;
  std::span<char> shared;
  std::vector<Fiber> fibers;
  std::vector<Meeting> warps, warpgroups;
  std::vector<std::shared_ptr<void>> async_state;  // one slot per warpgroup
  NamedBarrier barriers[kNamedBarriers];
  std::map<uint32_t, Mbarrier> mbarriers;  // by shared address
  int arrived = 0;  // at the block barrier
  uint64_t generation = 0;
  int done = 0;
  ReadySet ready;
  Order order = Order::kFixed;
  // Order::kPriority: whether each role yields (and goes last) at its 1st, 2nd, ... preemption
  // point, drawn by the first of its threads there, so that a role yields as one.
  std::vector<std::vector<bool>> yields;
  void* scheduler_sp = nullptr;
  Fiber* current = nullptr;
  std::function<void()> const* body = nullptr;
  std::exception_ptr error;  // thrown inside a fiber; rethrown by the scheduler
};

Block* g_block = nullptr;

int num_threads(Dim3 const& d) { return static_cast<int>(d.x * d.y * d.z); }

// The running fiber's index in the block, its linear thread index.
int current_tid() { return static_cast<int>(g_block->current - g_block->fibers.data()); }

// Switches to the scheduler; the fiber runs again once it is back in the ready set.
void switch_out() { cake_emu_switch(&g_block->current->sp, g_block->scheduler_sp); }

void maybe_release_block();
std::string block_name(Block const& b);

// Exceptions cannot unwind across contexts: a fiber's is kept and rethrown by the scheduler.
void fiber_entry() {
  try {
    (*g_block->body)();
  } catch (...) {
    g_block->error = std::current_exception();
  }
  Fiber& f = *g_block->current;
  if (!f.stores.empty() && !g_block->error)
    g_block->error = std::make_exception_ptr(std::runtime_error(
        "emulator: a thread of " + block_name(*g_block) +
        " exited with bulk stores not complete (no bulk_wait_group after them)"));
  f.done = true;
  ++g_block->done;
  maybe_release_block();  // its exit may complete the barrier the others wait at
  switch_out();           // never switched back to
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

// The block barrier completes when every thread that has not exited has arrived; all but the
// running thread (the last to arrive, or one that exited) wait there.
void maybe_release_block() {
  Block& b = *g_block;
  int const n = num_threads(b.block_dim);
  if (b.arrived > 0 && b.arrived + b.done == n) {
    b.arrived = 0;
    ++b.generation;
    int const self = current_tid();
    for (int t = 0; t < n; ++t)
      if (t != self && !b.fibers[t].done) b.ready.add(t);
    if (b.order == Order::kPriority) b.ready.shuffle(schedule().randomness);
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
  for (auto const& [address, m] : b.mbarriers)
    if (!m.waiting.empty())
      what += ", mbarrier at shared " + std::to_string(address) + ": " +
              std::to_string(m.waiting.size()) + " threads wait for phase " +
              std::to_string(m.phase) + " (" + std::to_string(m.pending) + " of " +
              std::to_string(m.count) + " arrivals and " + std::to_string(m.tx) +
              " bytes pending)";
  return what;
}

void run_block() {
  Block& b = *g_block;
  int const n = num_threads(b.block_dim);
  Randomness& random = schedule().randomness;
  b.order = !schedule().random ? Order::kFixed : random.bits(1) ? Order::kPriority : Order::kAny;
  b.ready.reset(n);
  if (b.order == Order::kPriority) b.ready.shuffle(random);
  b.yields.assign(b.ready.roles(), {});
  for (int t = 0; t < n; ++t) {
    Fiber& f = b.fibers[t];
    f.done = false;
    f.points = 0;
    f.copies.clear();
    f.stores.clear();
    f.thread_idx = Dim3{t % b.block_dim.x, t / b.block_dim.x % b.block_dim.y,
                        t / (b.block_dim.x * b.block_dim.y)};
    f.sp = initial_stack(f.stack + kGuardBytes + kStackBytes - t % kStaggers * kStaggerBytes);
    b.ready.add(t);
  }
  for (Meeting& w : b.warps) w.arrived = 0;
  for (Meeting& g : b.warpgroups) g.arrived = 0;
  for (auto& state : b.async_state) state.reset();
  for (NamedBarrier& bar : b.barriers) {
    bar.arrived = 0;
    bar.warps = 0;
    bar.waiting.clear();
  }
  b.mbarriers.clear();
  b.arrived = 0;
  b.done = 0;
  int last = -1;  // the fiber that ran last
  while (b.done < n) {
    if (b.ready.count() == 0)
      throw std::runtime_error("emulator deadlock in " + block_name(b) + ": " + waiting(b));
    int t = 0;
    switch (b.order) {
      case Order::kFixed:
        t = b.ready.take_next_after(last);
        break;
      case Order::kAny:
        t = b.ready.take_any(random.bits(32));
        break;
      case Order::kPriority:
        t = b.ready.take_first(random.bits(32));
        break;
    }
    b.current = &b.fibers[t];
    cake_emu_switch(&b.scheduler_sp, b.current->sp);
    if (b.error) std::rethrow_exception(b.error);
    last = t;
  }
  for (size_t g = 0; g < b.async_state.size(); ++g)
    if (b.async_state[g])
      throw std::runtime_error("emulator: warpgroup " + std::to_string(g) + " of " + block_name(b) +
                               " exited with asynchronous operations in flight (wgmma not "
                               "completed by a wgmma_wait)");
}

// The calling thread's part in `m`, the meeting of `threads` threads (`kind` number `index`: a
// warp or a warpgroup) of which it is `rank`.
void meet(Meeting& m, int threads, int rank, char const* kind, int index, void const* in,
          size_t in_size, void* out, size_t out_size, void (*op)(void const*, void*),
          char const* tag) {
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
  if (++m.arrived == threads) {
    op(m.in.data(), m.out.data());
    m.arrived = 0;
    // The others arrived before this one and wait here: each reads its output when it runs, before
    // it can arrive at the next meeting (which cannot complete without it and so leaves `out`).
    int const self = current_tid();
    g_block->ready.add_range(self - rank, threads, self);
  } else {
    switch_out();
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
  int const warp = current_tid() / 32;
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
  // The GPU counts arrivals, not which warp made them: a second one would complete the phase
  // without a warp it is meant to wait for (runtime.hpp, named_barrier).
  uint32_t const bit = uint32_t{1} << warp;
  if (bar.warps & bit)
    throw std::runtime_error(
        "emulator: named barrier " + std::to_string(in[0].id) + ": warp " + std::to_string(warp) +
        " arrives again (" + barrier_name(in[0]) + ") before the phase it arrived at completed (" +
        std::to_string(bar.arrived) + " of " + std::to_string(bar.expected) +
        " threads arrived): a bar.arrive for the next phase while this one is incomplete, which "
        "the GPU would count as another warp's arrival at this one");
  bar.warps |= bit;
  auto* out = static_cast<uint64_t*>(out_v);
  for (int l = 0; l < 32; ++l) out[l] = bar.generation;
  bar.arrived += 32;
  if (bar.arrived == bar.expected) {
    bar.arrived = 0;
    bar.warps = 0;
    ++bar.generation;
    for (int t : bar.waiting) g_block->ready.add(t);
    bar.waiting.clear();
    if (g_block->order == Order::kPriority) g_block->ready.shuffle(schedule().randomness);
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
  if (b.generation == generation) switch_out();
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
  NamedBarrier& bar = b.barriers[id];
  if (!wait) {
    preemption_point();  // the others may run between an arrival and what the warp does next
  } else if (bar.generation == generation) {
    bar.waiting.push_back(current_tid());
    switch_out();
  }
}

uint64_t schedule_seed() {
  static uint64_t const seed = seed_from_environment();
  return seed;
}

void set_schedule(uint64_t seed, uint64_t stream) { schedule().restart(seed, stream); }

void preemption_point() {
  Block& b = *g_block;
  Randomness& random = schedule().randomness;
  int const self = current_tid();
  switch (b.order) {
    case Order::kFixed:
      return;
    case Order::kAny:
      if (random.bits(1) == 0) return;
      break;
    case Order::kPriority: {
      int const role = b.ready.role_of(self);
      std::vector<bool>& yields = b.yields[role];
      size_t const point = b.current->points++;
      if (point == yields.size()) {
        yields.push_back(random.bits(1) != 0);
        if (yields.back()) b.ready.demote(role);
      }
      if (!yields[point]) return;
      break;
    }
  }
  b.ready.add(self);
  switch_out();
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
  int const tid = current_tid();
  meet(g_block->warps[tid / 32], 32, tid % 32, "warp", tid / 32, in, in_size, out, out_size, op,
       tag);
}

void warpgroup_meet_bytes(void const* in, size_t in_size, void* out, size_t out_size,
                          void (*op)(void const*, void*), char const* tag) {
  Block& b = *g_block;
  int const tid = current_tid();
  if (static_cast<size_t>(tid / 128) >= b.warpgroups.size())
    throw std::runtime_error(std::string("emulator: ") + tag + " in a block of " +
                             std::to_string(num_threads(b.block_dim)) +
                             " threads, not whole warpgroups of 128");
  meet(b.warpgroups[tid / 128], 128, tid % 128, "warpgroup", tid / 128, in, in_size, out, out_size,
       op, tag);
}

void cp_async_issue(void* smem, void const* gmem, int bytes, bool valid) {
  if (bytes <= 0 || bytes > 16) throw std::logic_error("emulator: cp.async copies 4 to 16 bytes");
  shared_address(smem);  // throws unless the destination is in the block's shared memory
  CpAsyncCopy c;
  c.dst = static_cast<char*>(smem);
  c.bytes = bytes;
  if (valid) std::memcpy(c.data, gmem, bytes);  // src-size 0 (invalid) lands zeros
  std::memset(c.dst, 0xff, bytes);
  g_block->current->copies.open.push_back(c);
}

void cp_async_commit_group() { g_block->current->copies.commit(); }

void cp_async_wait_group(int pending) {
  g_block->current->copies.complete_all_but(
      pending, [](CpAsyncCopy const& c) { std::memcpy(c.dst, c.data, c.bytes); });
  preemption_point();
}

namespace {

Mbarrier& mbarrier_at(void* bar) {
  auto const it = g_block->mbarriers.find(shared_address(bar));
  if (it == g_block->mbarriers.end())
    throw std::runtime_error("emulator: an mbarrier used before mbarrier_init");
  return it->second;
}

// Completes the phase once its arrivals and bytes are all in; its waiters run again.
void maybe_complete(Mbarrier& m) {
  if (m.pending != 0 || m.tx != 0) return;
  ++m.phase;
  m.pending = m.count;
  for (int t : m.waiting) g_block->ready.add(t);
  m.waiting.clear();
  if (g_block->order == Order::kPriority) g_block->ready.shuffle(schedule().randomness);
}

// The copies in flight on m land, each completing its bytes.
void land_copies(Mbarrier& m) {
  std::vector<BulkCopy> copies = std::move(m.copies);
  m.copies.clear();
  for (BulkCopy const& c : copies) {
    std::memcpy(c.dst, c.data.data(), c.data.size());
    m.tx -= static_cast<int64_t>(c.data.size());
  }
  maybe_complete(m);
}

}  // namespace

void mbarrier_init(void* bar, int count) {
  if (count <= 0) throw std::logic_error("emulator: mbarrier_init with a count below 1");
  Mbarrier& m = g_block->mbarriers[shared_address(bar)];
  if (!m.waiting.empty())
    throw std::runtime_error("emulator: mbarrier_init of a barrier that threads wait on");
  m = Mbarrier{};
  m.count = count;
  m.pending = count;
}

void mbarrier_arrive(void* bar, uint32_t tx_bytes) {
  Mbarrier& m = mbarrier_at(bar);
  m.tx += tx_bytes;
  if (m.pending == 0)
    throw std::runtime_error("emulator: an mbarrier arrival beyond its count in phase " +
                             std::to_string(m.phase));
  --m.pending;
  if (!m.waiting.empty()) land_copies(m);  // the copies a waiter waits for land now
  maybe_complete(m);
  preemption_point();
}

void mbarrier_wait(void* bar, int parity) {
  Mbarrier& m = mbarrier_at(bar);
  land_copies(m);
  while (static_cast<int>(m.phase & 1) == parity) {
    m.waiting.push_back(current_tid());
    switch_out();
  }
}

void bulk_copy_issue(void* dst, std::span<char const> bytes, void* bar) {
  shared_address(dst);  // throws unless the destination is in the block's shared memory
  shared_address(static_cast<char*>(dst) + bytes.size() - 1);
  Mbarrier& m = mbarrier_at(bar);
  m.copies.push_back(
      BulkCopy{static_cast<char*>(dst), std::vector<char>(bytes.begin(), bytes.end())});
  std::memset(dst, 0xff, bytes.size());
  if (!m.waiting.empty()) land_copies(m);
}

void bulk_store_issue(std::function<BulkStoreWrite()> read) {
  g_block->current->stores.open.push_back(BulkStore{std::move(read), {}});
}

void bulk_store_commit_group() { g_block->current->stores.commit(); }

void bulk_store_wait_group(int pending, bool reads_only) {
  AsyncGroups<BulkStore>& stores = g_block->current->stores;
  for (size_t g = 0; g + pending < stores.committed.size(); ++g)
    for (BulkStore& s : stores.committed[g])
      if (!s.write) s.write = s.read();
  if (!reads_only) stores.complete_all_but(pending, [](BulkStore const& s) { s.write(); });
  preemption_point();
}

std::shared_ptr<void>& warpgroup_async_state() { return g_block->async_state[current_tid() / 128]; }

void launch(Dim3 grid, Dim3 block_dim, std::span<char> shared, std::function<void()> const& body) {
  int const n = num_threads(block_dim);
  if (n % 32 != 0 || n > kMaxThreads)
    throw std::logic_error("emulator: blocks are whole warps, at most 1024 threads");
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
