// cake._C's conv functions: the conv's C entry points over DLPack tensors, each returning
// (code, message, value) (result.hpp); cake/abi.py raises, cake/ops.py wraps them for torch.
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

cakeConv1dForwardArgs_t forward_args(OptionalArray x, OptionalArray weight, OptionalArray bias,
                                     OptionalArray residual, OptionalArray initial_state,
                                     OptionalArray cu_seqlens, OptionalArray y,
                                     OptionalArray final_state, int activation) {
  return {sizeof(cakeConv1dForwardArgs_t),
          activation,
          view(x, "x"),
          view(weight, "weight"),
          view(bias, "bias"),
          view(residual, "residual"),
          view(initial_state, "initial_state"),
          view(cu_seqlens, "cu_seqlens"),
          view(y, "y"),
          view(final_state, "final_state")};
}

cakeConv1dBackwardArgs_t backward_args(OptionalArray x, OptionalArray weight, OptionalArray bias,
                                       OptionalArray initial_state, OptionalArray cu_seqlens,
                                       OptionalArray dy, OptionalArray dht, OptionalArray dx,
                                       OptionalArray dweight, OptionalArray dbias,
                                       OptionalArray dinitial_state, int activation) {
  return {sizeof(cakeConv1dBackwardArgs_t),
          activation,
          view(x, "x"),
          view(weight, "weight"),
          view(bias, "bias"),
          view(initial_state, "initial_state"),
          view(cu_seqlens, "cu_seqlens"),
          view(dy, "dy"),
          view(dht, "dht"),
          view(dx, "dx"),
          view(dweight, "dweight"),
          view(dbias, "dbias"),
          {},  // dresidual: the Python op passes dy on itself
          view(dinitial_state, "dinitial_state")};
}

// The forward's arguments, in the order cake/ops.py passes them.
#define CAKE_CONV1D_FORWARD_PARAMS                                                   \
  OptionalArray x, OptionalArray weight, OptionalArray bias, OptionalArray residual, \
      OptionalArray initial_state, OptionalArray cu_seqlens, OptionalArray y,        \
      OptionalArray final_state, int activation
#define CAKE_CONV1D_FORWARD_ARGS \
  forward_args(x, weight, bias, residual, initial_state, cu_seqlens, y, final_state, activation)
#define CAKE_CONV1D_BACKWARD_PARAMS                                                       \
  OptionalArray x, OptionalArray weight, OptionalArray bias, OptionalArray initial_state, \
      OptionalArray cu_seqlens, OptionalArray dy, OptionalArray dht, OptionalArray dx,    \
      OptionalArray dweight, OptionalArray dbias, OptionalArray dinitial_state, int activation
#define CAKE_CONV1D_BACKWARD_ARGS                                                        \
  backward_args(x, weight, bias, initial_state, cu_seqlens, dy, dht, dx, dweight, dbias, \
                dinitial_state, activation)

}  // namespace

void bind_conv1d(nb::module_& m) {
  m.def("conv1d_forward_workspace_size", [](CAKE_CONV1D_FORWARD_PARAMS) {
    return result([&] {
      cakeConv1dForwardArgs_t const args = CAKE_CONV1D_FORWARD_ARGS;
      size_t bytes = 0;
      check(cakeConv1dForwardWorkspaceSize(&args, &bytes));
      return bytes;
    });
  });
  m.def("conv1d_backward_workspace_size", [](CAKE_CONV1D_BACKWARD_PARAMS) {
    return result([&] {
      cakeConv1dBackwardArgs_t const args = CAKE_CONV1D_BACKWARD_ARGS;
      size_t bytes = 0;
      check(cakeConv1dBackwardWorkspaceSize(&args, &bytes));
      return bytes;
    });
  });
  m.def("conv1d_check_support", [](CAKE_CONV1D_FORWARD_PARAMS, int device_type) {
    return result([&] {
      cakeConv1dForwardArgs_t const args = CAKE_CONV1D_FORWARD_ARGS;
      check(cakeConv1dCheckSupport(&args, device_type));
    });
  });
  m.def("conv1d_forward",
        [](CAKE_CONV1D_FORWARD_PARAMS, OptionalArray workspace, uintptr_t stream) {
          return result([&] {
            cakeConv1dForwardArgs_t const args = CAKE_CONV1D_FORWARD_ARGS;
            auto const [ws, ws_bytes] = buffer_of(workspace);
            check_without_gil([&] {
              return cakeConv1dForward(&args, ws, ws_bytes, reinterpret_cast<void*>(stream));
            });
          });
        });
  m.def("conv1d_backward",
        [](CAKE_CONV1D_BACKWARD_PARAMS, OptionalArray workspace, uintptr_t stream) {
          return result([&] {
            cakeConv1dBackwardArgs_t const args = CAKE_CONV1D_BACKWARD_ARGS;
            auto const [ws, ws_bytes] = buffer_of(workspace);
            check_without_gil([&] {
              return cakeConv1dBackward(&args, ws, ws_bytes, reinterpret_cast<void*>(stream));
            });
          });
        });
}
