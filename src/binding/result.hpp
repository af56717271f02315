// Every function of cake._C returns (code, message, value): (0, "", value) on success, else a
// cakeResult_t and its message. No C++ exception crosses into nanobind's dispatch: failures are
// values, and cake/abi.py raises the Python exception of their code.
#pragma once

#include <nanobind/nanobind.h>

#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "cake/cake.h"
#include "core/error.hpp"

namespace cake::binding {

// Inside body: a failed C entry point becomes a cake::Error with its message (caught by result).
inline void check(cakeResult_t code) {
  if (code != cakeSuccess) throw Error(code, cakeGetLastError());
}

// Calls a C entry point that does the work (the kernels' launches, or the CPU reference's whole
// computation) without the GIL, so that other Python threads go on, then checks its result.
template <class Call>
void check_without_gil(Call&& call) {
  cakeResult_t code;
  {
    nanobind::gil_scoped_release release;
    code = call();
  }
  check(code);
}

// Runs body under cake::guard and returns the (code, message, value) triple.
template <class F>
nanobind::tuple result(F&& body) {
  namespace nb = nanobind;
  using Value = decltype(body());
  if constexpr (std::is_void_v<Value>) {
    cakeResult_t const code = guard([&] { body(); });
    if (code != cakeSuccess) {
      return nb::make_tuple(static_cast<int>(code), cakeGetLastError(), nb::none());
    }
    return nb::make_tuple(0, "", nb::none());
  } else {
    std::optional<Value> value;
    cakeResult_t const code = guard([&] { value.emplace(body()); });
    if (code != cakeSuccess) {
      return nb::make_tuple(static_cast<int>(code), cakeGetLastError(), nb::none());
    }
    return nb::make_tuple(0, "", nb::cast(std::move(*value)));
  }
}

}  // namespace cake::binding
