// parallel_for: run f(i) for i in [0, n) on the machine's cores.
//
// Work items must write disjoint memory. Each item runs on exactly one thread, so results do not
// depend on the thread count: the reference stays bitwise reproducible.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace cake::ref {

template <class F>
void parallel_for(int64_t n, F const& f) {
  int64_t const num_threads =
      std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (num_threads <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i = next++; i < n; i = next++) f(i);
  };
  std::vector<std::thread> threads;
  for (int64_t t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& thread : threads) thread.join();
}

}  // namespace cake::ref
