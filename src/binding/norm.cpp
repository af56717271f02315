// cake._C's norm functions: the norm's C entry points over DLPack tensors, each returning
// (code, message, value) (result.hpp); cake/abi.py raises, cake/norm.py wraps them for torch.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>

#include "binding/result.hpp"
#include "binding/view.hpp"
#include "cake/cake.h"

namespace nb = nanobind;

namespace {

using cake::binding::buffer_of;
using cake::binding::check;
using cake::binding::check_without_gil;
using cake::binding::OptionalArray;
using cake::binding::result;
using cake::binding::view;

cakeRmsNormForwardArgs_t forward_args(OptionalArray x, OptionalArray g, OptionalArray weight,
                                      OptionalArray y, OptionalArray rstd, double eps,
                                      int activation) {
  return {sizeof(cakeRmsNormForwardArgs_t),
          activation,
          eps,
          view(x, "x"),
          view(g, "g"),
          view(weight, "weight"),
          view(y, "y"),
          view(rstd, "rstd")};
}

cakeRmsNormBackwardArgs_t backward_args(OptionalArray x, OptionalArray g, OptionalArray weight,
                                        OptionalArray rstd, OptionalArray dy, OptionalArray dx,
                                        OptionalArray dg, OptionalArray dweight, int activation) {
  return {sizeof(cakeRmsNormBackwardArgs_t),
          activation,
          view(x, "x"),
          view(g, "g"),
          view(weight, "weight"),
          view(rstd, "rstd"),
          view(dy, "dy"),
          view(dx, "dx"),
          view(dg, "dg"),
          view(dweight, "dweight")};
}

// The arguments, in the order cake/norm.py passes them.
#define CAKE_NORM_FORWARD_PARAMS                                                               \
  OptionalArray x, OptionalArray g, OptionalArray weight, OptionalArray y, OptionalArray rstd, \
      double eps, int activation
#define CAKE_NORM_FORWARD_ARGS forward_args(x, g, weight, y, rstd, eps, activation)
#define CAKE_NORM_BACKWARD_PARAMS                                                               \
  OptionalArray x, OptionalArray g, OptionalArray weight, OptionalArray rstd, OptionalArray dy, \
      OptionalArray dx, OptionalArray dg, OptionalArray dweight, int activation
#define CAKE_NORM_BACKWARD_ARGS backward_args(x, g, weight, rstd, dy, dx, dg, dweight, activation)

}  // namespace

void bind_norm(nb::module_& m) {
  m.def("norm_backward_workspace_size", [](CAKE_NORM_BACKWARD_PARAMS) {
    return result([&] {
      cakeRmsNormBackwardArgs_t const args = CAKE_NORM_BACKWARD_ARGS;
      size_t bytes = 0;
      check(cakeRmsNormBackwardWorkspaceSize(&args, &bytes));
      return bytes;
    });
  });
  m.def("norm_check_support", [](CAKE_NORM_FORWARD_PARAMS, int device_type) {
    return result([&] {
      cakeRmsNormForwardArgs_t const args = CAKE_NORM_FORWARD_ARGS;
      check(cakeRmsNormCheckSupport(&args, device_type));
    });
  });
  m.def("norm_forward", [](CAKE_NORM_FORWARD_PARAMS, uintptr_t stream) {
    return result([&] {
      cakeRmsNormForwardArgs_t const args = CAKE_NORM_FORWARD_ARGS;
      check_without_gil([&] { return cakeRmsNormForward(&args, reinterpret_cast<void*>(stream)); });
    });
  });
  m.def("norm_backward", [](CAKE_NORM_BACKWARD_PARAMS, OptionalArray workspace, uintptr_t stream) {
    return result([&] {
      cakeRmsNormBackwardArgs_t const args = CAKE_NORM_BACKWARD_ARGS;
      auto const [ws, ws_bytes] = buffer_of(workspace);
      check_without_gil([&] {
        return cakeRmsNormBackward(&args, ws, ws_bytes, reinterpret_cast<void*>(stream));
      });
    });
  });
}
