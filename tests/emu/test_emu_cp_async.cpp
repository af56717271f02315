// The emulator's cp.async (emu/runtime.hpp, cp_async_issue): a copy's destination is poisoned at
// issue and written when a wait_group completes the copy's group; wait_group<1> completes every
// committed group but the newest; an invalid copy (src-size 0) lands zeros; groups are per
// thread. On the GPU a copy lands at some time between issue and its wait: a kernel that reads
// before the wait is wrong there under some timing, here always.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "emu/runtime.hpp"  // first: the CUDA builtins the kernels use, on the CPU
#include "kernels/common/ptx.cuh"

namespace {

using cake::emu::Dim3;
using namespace cake::kernels;

// What one thread saw of its 16-byte destination at each point.
struct Seen {
  uint32_t after_issue, after_wait1, after_wait0;
  uint32_t second_after_wait1, invalid_after_wait0;
};

TEST(EmulatedCpAsync, CopiesLandAtTheWaitThatCompletesTheirGroup) {
  std::vector<uint32_t> src(2 * 32 * 4);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint32_t>(1000 + i);
  std::vector<char> shared(3 * 32 * 16);
  std::vector<Seen> seen(32);
  for (uint64_t seed : {0, 3}) {
    cake::emu::set_schedule(seed);
    cake::emu::launch(Dim3{1}, Dim3{32}, shared, [&] {
      int const t = static_cast<int>(threadIdx.x);
      auto* const first = reinterpret_cast<uint32_t*>(shared.data() + 16 * t);
      auto* const second = reinterpret_cast<uint32_t*>(shared.data() + 16 * (32 + t));
      auto* const invalid = reinterpret_cast<uint32_t*>(shared.data() + 16 * (64 + t));
      *invalid = 7;
      cp_async_16(first, src.data() + 4 * t, true);
      cp_async_commit();
      seen[t].after_issue = *first;
      cp_async_16(second, src.data() + 4 * (32 + t), true);
      cp_async_16(invalid, src.data(), false);
      cp_async_commit();
      cp_async_wait<1>();
      seen[t].after_wait1 = *first;
      seen[t].second_after_wait1 = *second;
      cp_async_wait<0>();
      seen[t].after_wait0 = *second;
      seen[t].invalid_after_wait0 = *invalid;
    });
    for (int t = 0; t < 32; ++t) {
      EXPECT_EQ(seen[t].after_issue, 0xffffffffu) << "thread " << t << ", seed " << seed;
      EXPECT_EQ(seen[t].after_wait1, 1000u + 4 * t);
      EXPECT_EQ(seen[t].second_after_wait1, 0xffffffffu);
      EXPECT_EQ(seen[t].after_wait0, 1000u + 4 * (32 + t));
      EXPECT_EQ(seen[t].invalid_after_wait0, 0u);
    }
  }
}

// A consumer that reads a tile after the producer's barrier but without the producer's wait
// reads poison: the wait is what makes the copies land, not the barrier.
TEST(EmulatedCpAsync, AProducerThatSkipsItsWaitHandsOverPoison) {
  std::vector<float> src(32 * 4, 2.5f);
  std::vector<char> shared(32 * 16);
  float read = 0.f;
  for (uint64_t seed : {0, 5}) {
    cake::emu::set_schedule(seed);
    cake::emu::launch(Dim3{1}, Dim3{64}, shared, [&] {
      int const t = static_cast<int>(threadIdx.x);
      if (t < 32) {
        cp_async_16(shared.data() + 16 * t, src.data() + 4 * t, true);
        cp_async_commit();
        named_barrier_arrive(1, 64);  // no cp_async_wait: the copies are still in flight
        named_barrier_sync(2, 64);    // until the consumer has read
        cp_async_wait<0>();
      } else {
        named_barrier_sync(1, 64);
        if (t == 32) std::memcpy(&read, shared.data(), sizeof read);
        named_barrier_arrive(2, 64);
      }
    });
    EXPECT_TRUE(read != read) << "seed " << seed << ": read " << read << ", expected the poison";
  }
}

}  // namespace
