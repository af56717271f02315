// The warpgroup products of emu/wgmma.hpp: descriptors decoded into offsets in the block's shared
// memory, the groups each warpgroup has in flight, and the products computed when completed.
#include "emu/wgmma.hpp"

#include <array>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu/runtime.hpp"

namespace cake::emu {

namespace {

constexpr int kM = 64;         // rows of A and D
constexpr int kK = 16;         // the reduction length of one product
constexpr int kThreads = 128;  // a warpgroup

// A matrix descriptor's fields in bytes: the operand's start in the shared window, and the
// offsets between core matrices (8 rows of 16 bytes) adjacent along K (LBO) and along M or N
// (SBO).
struct Descriptor {
  uint32_t start, lbo, sbo;
  bool swizzle128;  // mode 1: 128-byte swizzle
};

// Bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 49-51 base offset, 62-63 swizzle mode.
Descriptor decode(uint64_t desc) {
  if (desc >> 62 > 1)
    throw std::runtime_error("emulator: wgmma descriptor with swizzle mode " +
                             std::to_string(desc >> 62) +
                             " (bits 62-63): only the unswizzled layout (0) and the 128-byte "
                             "swizzle (1) are emulated");
  if ((desc >> 49 & 7) != 0)
    throw std::runtime_error(
        "emulator: wgmma descriptor with a base offset (bits 49-51), which only swizzled layouts "
        "use");
  auto const field = [desc](int bit) { return static_cast<uint32_t>(desc >> bit & 0x3fff) << 4; };
  return {field(0), field(16), field(32), desc >> 62 == 1};
}

// Byte offset of element (mn, k) of an operand in the unswizzled canonical layouts: its core
// matrix at (mn / 8) SBO + (k / 8) LBO from the start; a core matrix row (16 bytes) holds 8
// consecutive k (K-major) or 8 consecutive mn (MN-major, the transposed operand).
// With the 128-byte swizzle (CUTLASS's canonical layouts, mma_traits_sm90_gmma.hpp), 128-byte
// rows in 1024-byte atoms of 8: K-major, element (mn, k) at start + (mn / 8) SBO + (mn % 8) 128 +
// 2 k (the k of one product stay in one row); MN-major, at start + (mn / 64) LBO + (k / 8) SBO +
// (k % 8) 128 + 2 (mn % 64); then the address's 16-byte chunk (bits 4-6) XOR its row in the atom
// (bits 7-9), as the GPU swizzles shared addresses (atoms 1024-byte aligned, base offset 0).
uint32_t element_offset(Descriptor const& d, bool mn_major, int mn, int k) {
  if (d.swizzle128) {
    uint32_t const a = mn_major
                           ? d.start + mn / 64 * d.lbo + k / 8 * d.sbo + k % 8 * 128 + mn % 64 * 2
                           : d.start + mn / 8 * d.sbo + mn % 8 * 128 + k * 2;
    return a ^ ((a >> 7 & 7) << 4);
  }
  uint32_t const core = d.start + mn / 8 * d.sbo + k / 8 * d.lbo;
  return mn_major ? core + k % 8 * 16 + mn % 8 * 2 : core + mn % 8 * 16 + k % 8 * 2;
}

uint16_t load_bf16(std::span<char const> shared, uint32_t offset, char const* name) {
  if (offset + 2 > shared.size())
    throw std::runtime_error(std::string("emulator: wgmma operand ") + name +
                             " reads shared offset " + std::to_string(offset) +
                             ", past the block's " + std::to_string(shared.size()) + " bytes");
  uint16_t bits;
  std::memcpy(&bits, shared.data() + offset, 2);
  return bits;
}

// An operand as read at issue: element (mn, k) at [mn * kK + k], its offset in the shared window
// and its bf16 bits.
struct Operand {
  char const* name;  // "A" or "B"
  std::vector<uint32_t> offset;
  std::vector<uint16_t> bits;

  float at(int mn, int k) const {
    return __builtin_bit_cast(float, uint32_t{bits[mn * kK + k]} << 16);
  }
};

Operand read_operand(char const* name, uint64_t desc, bool mn_major, int rows) {
  Descriptor const d = decode(desc);
  std::span<char const> const shared = shared_memory();
  Operand op{name, std::vector<uint32_t>(rows * kK), std::vector<uint16_t>(rows * kK)};
  for (int mn = 0; mn < rows; ++mn)
    for (int k = 0; k < kK; ++k) {
      op.offset[mn * kK + k] = element_offset(d, mn_major, mn, k);
      op.bits[mn * kK + k] = load_bf16(shared, op.offset[mn * kK + k], name);
    }
  return op;
}

void check_unchanged(Operand const& op) {
  std::span<char const> const shared = shared_memory();
  for (size_t i = 0; i < op.bits.size(); ++i)
    if (load_bf16(shared, op.offset[i], op.name) != op.bits[i])
      throw std::runtime_error(
          std::string("wgmma operand in shared memory changed before wait_group: ") + op.name +
          " element (mn " + std::to_string(i / kK) + ", k " + std::to_string(i % kK) +
          " of its 16) at shared offset " + std::to_string(op.offset[i]));
}

// The accumulator registers of the warpgroup's 128 threads (size floats each) while products
// into them are in flight.
struct Accumulator {
  std::array<float*, kThreads> regs;
  int size;
  // [kThreads][size]: the registers as the emulator last read (at the first issue into them) or
  // wrote them (at each completion).
  std::vector<float> held;
  int in_flight = 0;
};

struct Product {
  int n;
  Operand a, b;  // A [64 x 16] at (m, k), B [16 x n] at (n, k)
  std::shared_ptr<Accumulator> acc;
};

// A warpgroup's wgmma in flight, kept in its warpgroup_async_state while there are any.
struct InFlight {
  std::vector<Product> open;                   // issued since the last commit
  std::deque<std::vector<Product>> committed;  // oldest first
  std::vector<std::shared_ptr<Accumulator>> accumulators;
};

InFlight& in_flight() {
  std::shared_ptr<void>& slot = warpgroup_async_state();
  if (!slot) slot = std::make_shared<InFlight>();
  return *static_cast<InFlight*>(slot.get());
}

// Empties the slot once no product is in flight (the empty groups left then are older than any
// later one, so that no wait_group counts them among its most recent).
void release_if_idle() {
  std::shared_ptr<void>& slot = warpgroup_async_state();
  auto const& f = *static_cast<InFlight const*>(slot.get());
  if (!f.open.empty()) return;
  for (auto const& group : f.committed)
    if (!group.empty()) return;
  slot.reset();
}

// Accumulator i of thread t holds D[row][col] (PTX's m64nNk16 fp32 fragment, as wgmma.cuh's
// for_each_wgmma_pair walks it): warp w = t / 32 holds rows 16 w .. 16 w + 15.
int row_of(int t, int i) { return 16 * (t / 32) + t % 32 / 4 + 8 * (i % 4 / 2); }
int col_of(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }

// D = A B + C, summed in double and rounded once (the tensor cores' order and width are not
// specified), into the registers; after checking what the kernel had to leave alone.
void complete(Product const& p) {
  check_unchanged(p.a);
  check_unchanged(p.b);
  Accumulator& acc = *p.acc;
  for (int t = 0; t < kThreads; ++t)
    if (std::memcmp(acc.regs[t], &acc.held[t * acc.size], acc.size * sizeof(float)) != 0)
      throw std::runtime_error("wgmma accumulators changed before wait_group: thread " +
                               std::to_string(t) +
                               " of the warpgroup wrote registers a product in flight owns");
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < acc.size; ++i) {
      int const r = row_of(t, i), c = col_of(t, i);
      double sum = acc.held[t * acc.size + i];
      for (int k = 0; k < kK; ++k) sum += double{p.a.at(r, k)} * double{p.b.at(c, k)};
      acc.held[t * acc.size + i] = static_cast<float>(sum);
    }
  for (int t = 0; t < kThreads; ++t)
    std::memcpy(acc.regs[t], &acc.held[t * acc.size], acc.size * sizeof(float));
  --acc.in_flight;
}

struct IssueIn {
  float* d;
  uint64_t desc_a, desc_b;
  int n, trans_a, trans_b;

  bool same_product(IssueIn const& o) const {
    return desc_a == o.desc_a && desc_b == o.desc_b && n == o.n && trans_a == o.trans_a &&
           trans_b == o.trans_b;
  }
};

// The accumulators of a product issued with `in`: those of a product in flight when they are the
// same registers (D of one is C of the next, in issue order), else read from the registers now.
std::shared_ptr<Accumulator> accumulator_of(InFlight& f, IssueIn const* in) {
  int const size = in[0].n / 2;
  for (auto const& acc : f.accumulators) {
    bool same = acc->size == size, overlap = false;
    for (int t = 0; t < kThreads; ++t) {
      same = same && acc->regs[t] == in[t].d;
      overlap = overlap || (in[t].d < acc->regs[t] + acc->size && acc->regs[t] < in[t].d + size);
    }
    if (same) return acc;
    if (overlap)
      throw std::runtime_error(
          "emulator: wgmma accumulators overlap those of a product in flight without being the "
          "same registers");
  }
  auto acc = std::make_shared<Accumulator>();
  acc->size = size;
  acc->held.resize(kThreads * size);
  for (int t = 0; t < kThreads; ++t) {
    acc->regs[t] = in[t].d;
    std::memcpy(&acc->held[t * size], in[t].d, size * sizeof(float));
  }
  f.accumulators.push_back(acc);
  return acc;
}

void issue_op(void const* in_v, void*) {
  auto const* in = static_cast<IssueIn const*>(in_v);
  for (int t = 1; t < kThreads; ++t)
    if (!in[t].same_product(in[0]))
      throw std::runtime_error(
          "emulator: the threads of a warpgroup issue different wgmma (descriptors, shape or "
          "majors differ)");
  InFlight& f = in_flight();
  std::shared_ptr<Accumulator> acc = accumulator_of(f, in);
  ++acc->in_flight;
  f.open.push_back(Product{in[0].n, read_operand("A", in[0].desc_a, in[0].trans_a != 0, kM),
                           read_operand("B", in[0].desc_b, in[0].trans_b != 0, in[0].n), acc});
}

void fence_op(void const*, void*) {}

void commit_op(void const*, void*) {
  InFlight& f = in_flight();
  f.committed.push_back(std::move(f.open));
  f.open.clear();
  release_if_idle();
}

void wait_op(void const* in_v, void*) {
  auto const* pending = static_cast<int const*>(in_v);
  for (int t = 1; t < kThreads; ++t)
    if (pending[t] != pending[0])
      throw std::runtime_error("emulator: the threads of a warpgroup wait_group with different N");
  InFlight& f = in_flight();
  while (f.committed.size() > static_cast<size_t>(pending[0])) {
    for (Product const& p : f.committed.front()) complete(p);
    f.committed.pop_front();
  }
  std::erase_if(f.accumulators, [](auto const& acc) { return acc->in_flight == 0; });
  release_if_idle();
}

// The warpgroup's meeting for op; no output.
template <class In>
void meet(In const& in, void (*op)(void const*, void*), char const* tag) {
  char none;
  warpgroup_meet_bytes(&in, sizeof(In), &none, 0, op, tag);
}

}  // namespace

void wgmma_issue(int n, bool trans_a, bool trans_b, float* d, uint64_t desc_a, uint64_t desc_b) {
  meet(IssueIn{d, desc_a, desc_b, n, trans_a ? 1 : 0, trans_b ? 1 : 0}, &issue_op,
       "wgmma.mma_async");
}

void wgmma_fence() { meet(0, &fence_op, "wgmma.fence"); }

// A preemption point after the commit: the other roles may run while the group is in flight.
void wgmma_commit() {
  meet(0, &commit_op, "wgmma.commit_group");
  preemption_point();
}

void wgmma_wait(int pending) { meet(pending, &wait_op, "wgmma.wait_group"); }

}  // namespace cake::emu
