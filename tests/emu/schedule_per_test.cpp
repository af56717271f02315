// Each emulated test starts its schedule afresh from the process's seed (emu::schedule_seed) and
// its own name, so that a test that fails in a whole run replays alone: CAKE_EMU_SEED=N
// cake_emu_tests --gtest_filter=Suite.Name, N the seed the run printed.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "emu/runtime.hpp"

namespace {

class RestartSchedule : public testing::EmptyTestEventListener {
  void OnTestStart(testing::TestInfo const& test) override {
    std::string const name = std::string(test.test_suite_name()) + "." + test.name();
    cake::emu::set_schedule(cake::emu::schedule_seed(), std::hash<std::string>{}(name));
  }
};

// gtest_main runs the tests; the listener joins before it does, when this file's statics are made.
[[maybe_unused]] bool const registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new RestartSchedule);
  return true;
}();

}  // namespace
