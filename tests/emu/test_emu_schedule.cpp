// The emulator's schedules (emu/runtime.hpp): seed 0 runs ready threads in thread order, any other
// seed in a random order that it determines (per block, any thread of any warp, or by a random
// priority of the roles), with preemption points after bar.arrive. A two-role kernel hands rounds
// of data from a producer warp to a consumer warp through named barriers, as the
// warp-specialised kernels do; with a hand-over bug planted in it, it passes the fixed order and
// fails (wrong values or an error) under some of 20 random seeds; correct, it passes all of them.
// A warp arriving at a barrier twice in one phase throws under every schedule; a seed replays.
#include "emu/runtime.hpp"  // first: the CUDA builtins the kernels use, on the CPU

#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "emu/gdn_emu_testing.hpp"
#include "kernels/common/ptx.cuh"

namespace {

using cake::emu::Dim3;
using cake::emu_testing::poisoned;
using namespace cake::kernels;

constexpr int kRounds = 8;
constexpr int kThreads = 64;  // warp 0 produces, warp 1 consumes
constexpr int kSeeds = 20;    // random schedules tried: seeds 1 .. kSeeds

alignas(128) char smem_raw[128 * sizeof(float)];

// How the producer hands a round over. Correct: it waits until the consumer freed the buffer,
// fills it, then arrives at "full". The others are bugs that the fixed order hides.
enum class Handover {
  kCorrect,
  kWriteAfterArrive,  // arrives at "full", then fills the buffer
  kOtherFree,         // waits until the consumer freed the other buffer, then fills this one
  kOneFullBarrier,    // one "full" barrier for both buffers: may arrive for round r + 1 before
                      // the consumer synced round r
};

// Round r: the producer (warp 0) writes x[r] into buffer s = r % 2 and arrives at full(s); the
// consumer (warp 1) syncs on full(s), writes y[r] = 2 x[r] from the buffer, and arrives at free(s)
// (ids 3, 4), which the producer syncs on before it refills the buffer (round r + 2). full(s) is
// barrier 1 + s, or 1 for both (kOneFullBarrier). Consumer lane l reads what producer lane l wrote:
// the fixed order, which runs the two warps' lanes in step, then hides the bugs.
template <Handover kHandover>
__global__ void __launch_bounds__(kThreads) handover_kernel(float const* x, float* y) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const buf = reinterpret_cast<float*>(smem_raw);  // [2][32]
  int const lane = threadIdx.x % 32;
  auto const full = [](int s) { return kHandover == Handover::kOneFullBarrier ? 1 : 1 + s; };
  if (threadIdx.x < 32) {
    for (int r = 0; r < kRounds; ++r) {
      int const s = r % 2;
      int const freed = kHandover == Handover::kOtherFree ? 4 - s : 3 + s;
      if (r >= 2) named_barrier_sync(freed, kThreads);
      if (kHandover == Handover::kWriteAfterArrive) named_barrier_arrive(full(s), kThreads);
      buf[s * 32 + lane] = x[r * 32 + lane];
      if (kHandover != Handover::kWriteAfterArrive) named_barrier_arrive(full(s), kThreads);
    }
  } else {
    for (int r = 0; r < kRounds; ++r) {
      int const s = r % 2;
      named_barrier_sync(full(s), kThreads);
      y[r * 32 + lane] = 2.f * buf[s * 32 + lane];
      if (r + 2 < kRounds) named_barrier_arrive(3 + s, kThreads);
    }
  }
}

// Runs the kernel under schedule `seed`: "" if it computed y right, else what went wrong. (Each
// test starts from the process's schedule again: schedule_per_test.cpp.)
template <Handover kHandover>
std::string run_handover(uint64_t seed) {
  std::vector<float> x(kRounds * 32);
  for (int i = 0; i < kRounds * 32; ++i) x[i] = static_cast<float>(i + 1);
  std::vector<float> y = poisoned<float>(kRounds * 32);
  cake::emu::set_schedule(seed);
  try {
    cake::emu::launch(Dim3{1}, Dim3{kThreads}, smem_raw,
                      [&] { handover_kernel<kHandover>(x.data(), y.data()); });
  } catch (std::exception const& e) {
    return e.what();
  }
  for (int r = 0; r < kRounds; ++r)
    for (int l = 0; l < 32; ++l)
      if (!(y[r * 32 + l] == 2.f * x[r * 32 + l]))
        return "wrong y at round " + std::to_string(r) + ", lane " + std::to_string(l);
  return "";
}

// The seeds in 1 .. kSeeds under which the kernel fails, with what went wrong under the first.
template <Handover kHandover>
std::string failing_seeds() {
  std::string seeds, first;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    std::string const error = run_handover<kHandover>(seed);
    if (error.empty()) continue;
    if (first.empty()) first = error;
    seeds += " " + std::to_string(seed);
  }
  return seeds.empty() ? "" : "seeds" + seeds + "; the first: " + first;
}

TEST(EmulatedSchedule, CorrectHandoverPassesEverySchedule) {
  EXPECT_EQ(run_handover<Handover::kCorrect>(0), "");
  EXPECT_EQ(failing_seeds<Handover::kCorrect>(), "");
}

TEST(EmulatedSchedule, WriteAfterArrivePassesTheFixedOrderOnly) {
  EXPECT_EQ(run_handover<Handover::kWriteAfterArrive>(0), "");
  std::string const failing = failing_seeds<Handover::kWriteAfterArrive>();
  EXPECT_NE(failing, "");
  std::cout << "kWriteAfterArrive fails under " << failing << "\n";
}

TEST(EmulatedSchedule, OtherFreePassesTheFixedOrderOnly) {
  EXPECT_EQ(run_handover<Handover::kOtherFree>(0), "");
  std::string const failing = failing_seeds<Handover::kOtherFree>();
  EXPECT_NE(failing, "");
  std::cout << "kOtherFree fails under " << failing << "\n";
}

TEST(EmulatedSchedule, ArrivalForTheNextPhasePassesTheFixedOrderOnly) {
  EXPECT_EQ(run_handover<Handover::kOneFullBarrier>(0), "");
  std::string const failing = failing_seeds<Handover::kOneFullBarrier>();
  EXPECT_NE(failing, "");
  std::cout << "kOneFullBarrier fails under " << failing << "\n";
}

// Two warpgroup roles, as in the kernels' warp specialisation: the producer (warpgroup 0) arrives
// at barrier 1 and then (the bug) writes the buffer; the consumer (warpgroup 1) works a while (32
// warp collectives) before it syncs there and reads. Unless the producer lags behind from its
// arrival on, the buffer is written long before the consumer reads: picks of any thread keep it
// so; a priority of the roles, drawn anew when the barrier completes, puts the consumer first.
constexpr int kRoleThreads = 128;

__global__ void __launch_bounds__(2 * kRoleThreads) lagging_kernel(float const* x, float* y) {
  extern __shared__ __align__(128) char smem_raw[];
  auto* const buf = reinterpret_cast<float*>(smem_raw);  // [kRoleThreads]
  int const t = threadIdx.x % kRoleThreads;
  if (threadIdx.x < kRoleThreads) {
    named_barrier_arrive(1, 2 * kRoleThreads);
    buf[t] = x[t];
  } else {
    for (int i = 0; i < 32; ++i) __syncwarp();
    named_barrier_sync(1, 2 * kRoleThreads);
    y[blockIdx.x * kRoleThreads + t] = 2.f * buf[t];
  }
}

// "" if the lagging kernel computed y right under schedule `seed`, else the first wrong element.
std::string run_lagging(uint64_t seed) {
  constexpr int kBlocks = 4;
  std::vector<float> x(kRoleThreads);
  for (int i = 0; i < kRoleThreads; ++i) x[i] = static_cast<float>(i + 1);
  std::vector<float> y = poisoned<float>(kBlocks * kRoleThreads);
  cake::emu::set_schedule(seed);
  cake::emu::launch(Dim3{kBlocks}, Dim3{2 * kRoleThreads}, smem_raw,
                    [&] { lagging_kernel(x.data(), y.data()); });
  for (int b = 0; b < kBlocks; ++b)
    for (int i = 0; i < kRoleThreads; ++i)
      if (!(y[b * kRoleThreads + i] == 2.f * x[i]))
        return "wrong y at block " + std::to_string(b) + ", thread " + std::to_string(i);
  return "";
}

TEST(EmulatedSchedule, ReadingBeforeALaggingProducerWritesPassesTheFixedOrderOnly) {
  EXPECT_EQ(run_lagging(0), "");
  std::string seeds;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed)
    if (!run_lagging(seed).empty()) seeds += " " + std::to_string(seed);
  EXPECT_NE(seeds, "");
  std::cout << "the lagging producer is caught under seeds" << seeds << "\n";
}

// Warp 0 arrives at barrier 1 twice before warp 1, which waits for it at barrier 2 first, syncs
// on barrier 1: on the GPU the second arrival would complete barrier 1's first phase.
__global__ void __launch_bounds__(kThreads) twice_kernel() {
  if (threadIdx.x < 32) {
    named_barrier_arrive(1, kThreads);
    named_barrier_arrive(1, kThreads);
    named_barrier_arrive(2, kThreads);
  } else {
    named_barrier_sync(2, kThreads);
    named_barrier_sync(1, kThreads);
    named_barrier_sync(1, kThreads);
  }
}

TEST(EmulatedSchedule, ArrivingTwiceInOnePhaseThrowsUnderEverySchedule) {
  for (uint64_t seed = 0; seed <= 5; ++seed) {
    cake::emu::set_schedule(seed);
    std::string error;
    try {
      cake::emu::launch(Dim3{1}, Dim3{kThreads}, {}, [] { twice_kernel(); });
    } catch (std::exception const& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("named barrier 1: warp 0 arrives again (bar.arrive) before the phase it "
                         "arrived at completed (32 of 64 threads arrived)"),
              std::string::npos)
        << "seed " << seed << ": " << error;
  }
}

// The order in which the threads of two warps pass three warp collectives.
std::vector<int> order_under(uint64_t seed) {
  std::vector<int> order;
  cake::emu::set_schedule(seed);
  cake::emu::launch(Dim3{1}, Dim3{kThreads}, {}, [&] {
    for (int i = 0; i < 3; ++i) {
      __syncwarp();
      order.push_back(static_cast<int>(threadIdx.x));
    }
  });
  return order;
}

TEST(EmulatedSchedule, ASeedReplaysItsOrder) {
  std::vector<int> const fixed = order_under(0);
  ASSERT_EQ(fixed.size(), 3u * kThreads);
  EXPECT_EQ(fixed.front(), 31);  // lane 31, the last of warp 0 to meet, goes on at once
  EXPECT_EQ(order_under(0), fixed);
  std::vector<int> const seven = order_under(7);
  EXPECT_EQ(order_under(7), seven);
  EXPECT_NE(order_under(8), seven);
  EXPECT_NE(seven, fixed);
}

}  // namespace
