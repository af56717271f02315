// Errors inside the library are cake::Error exceptions; the C entry points (src/ops/api.cpp) turn
// them into a cakeResult_t plus the thread-local message of cakeGetLastError(). No exception
// crosses the C ABI.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "cake/cake.h"

namespace cake {

class Error : public std::runtime_error {
 public:
  Error(cakeResult_t code, std::string const& message) : std::runtime_error(message), code_(code) {}
  cakeResult_t code() const { return code_; }

 private:
  cakeResult_t code_;
};

// Concatenates the arguments with operator<< into one message.
template <class... Args>
std::string concat(Args const&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Runs body; returns cakeSuccess, or the failure's code after recording its message.
cakeResult_t guard(void (*body)(void*), void* context);

template <class F>
cakeResult_t guard(F&& f) {
  return guard([](void* c) { (*static_cast<F*>(c))(); }, &f);
}

}  // namespace cake

// Throws cake::Error(code, message) unless cond holds. The message should name the argument,
// what was expected and what came.
#define CAKE_CHECK(cond, code, ...)                                  \
  do {                                                               \
    if (!(cond)) throw ::cake::Error((code), ::cake::concat(__VA_ARGS__)); \
  } while (0)
