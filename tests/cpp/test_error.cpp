// The C ABI's error reporting: result names and the thread-local last-error message.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "cake/cake.h"
#include "core/error.hpp"

TEST(Error, GuardRecordsCodeAndMessage) {
  cakeResult_t r = cake::guard([] {
    CAKE_CHECK(1 + 1 == 3, cakeInvalidArgument, "q must have 4 dims, got ", 3);
  });
  EXPECT_EQ(r, cakeInvalidArgument);
  EXPECT_EQ(std::string(cakeGetLastError()), "q must have 4 dims, got 3");
  EXPECT_EQ(std::string(cakeGetErrorString(r)), "cakeInvalidArgument");
}

TEST(Error, LastErrorIsPerThread) {
  cake::guard([] { CAKE_CHECK(false, cakeNotSupported, "main thread"); });
  std::thread([] {
    EXPECT_EQ(std::string(cakeGetLastError()), "");
    cake::guard([] { CAKE_CHECK(false, cakeNotSupported, "other thread"); });
    EXPECT_EQ(std::string(cakeGetLastError()), "other thread");
  }).join();
  EXPECT_EQ(std::string(cakeGetLastError()), "main thread");
}

TEST(Error, SuccessKeepsCode) {
  EXPECT_EQ(cake::guard([] {}), cakeSuccess);
}
