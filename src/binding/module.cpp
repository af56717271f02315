// cake._C: the C ABI over DLPack tensors (torch, numpy, ...) without linking libtorch.
// One function per C entry point, each returning (code, message, value) (result.hpp); cake/abi.py
// turns failures into Python exceptions and cake/ops.py wraps the calls for torch.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "binding/result.hpp"
#include "binding/view.hpp"
#include "cake/cake.h"
#include "core/error.hpp"
#include "core/tensor.hpp"

namespace nb = nanobind;
void bind_kcp(nanobind::module_& m);
void bind_conv1d(nanobind::module_& m);
void bind_norm(nanobind::module_& m);

namespace {

using cake::binding::buffer_of;
using cake::binding::check;
using cake::binding::check_without_gil;
using cake::binding::OptionalArray;
using cake::binding::placeholder;
using cake::binding::result;
using cake::binding::view;

cakeOptions_t options(int variant, double scale, bool use_qk_l2norm, bool use_gate_in_kernel,
                      std::optional<double> lower_bound, bool use_beta_sigmoid,
                      bool allow_neg_eigval, int save_for_backward, bool unordered_sums) {
  cakeOptions_t o{};
  o.struct_size = sizeof(cakeOptions_t);
  o.variant = static_cast<cakeVariant_t>(variant);
  o.scale = scale;
  o.use_qk_l2norm = use_qk_l2norm;
  o.use_gate_in_kernel = use_gate_in_kernel;
  o.has_lower_bound = lower_bound.has_value();
  o.lower_bound = lower_bound.value_or(0.0);
  o.use_beta_sigmoid = use_beta_sigmoid;
  o.allow_neg_eigval = allow_neg_eigval;
  o.save_for_backward = save_for_backward;
  o.unordered_sums = unordered_sums;
  return o;
}

// The inputs shared by the forward and the backward, in the order the Python side passes them.
#define CAKE_INPUT_PARAMS                                                                     \
  OptionalArray q, OptionalArray k, OptionalArray v, OptionalArray g, OptionalArray beta,    \
      OptionalArray initial_state, OptionalArray cu_seqlens, OptionalArray A_log,             \
      OptionalArray dt_bias
#define CAKE_OPTION_PARAMS                                                                    \
  int variant, double scale, bool use_qk_l2norm, bool use_gate_in_kernel,                    \
      std::optional<double> lower_bound, bool use_beta_sigmoid, bool allow_neg_eigval,        \
      int save_for_backward, bool unordered_sums
#define CAKE_OPTIONS \
  options(variant, scale, use_qk_l2norm, use_gate_in_kernel, lower_bound, use_beta_sigmoid, \
          allow_neg_eigval, save_for_backward, unordered_sums)

cakeForwardArgs_t forward_args(CAKE_INPUT_PARAMS, OptionalArray o, OptionalArray final_state) {
  return {view(q, "q"),
          view(k, "k"),
          view(v, "v"),
          view(g, "g"),
          view(beta, "beta"),
          view(initial_state, "initial_state"),
          view(cu_seqlens, "cu_seqlens"),
          view(A_log, "A_log"),
          view(dt_bias, "dt_bias"),
          view(o, "o"),
          view(final_state, "final_state")};
}

cakeBackwardArgs_t backward_args(CAKE_INPUT_PARAMS, OptionalArray dout, OptionalArray dht,
                                 OptionalArray dq, OptionalArray dk, OptionalArray dv,
                                 OptionalArray dg, OptionalArray dbeta, OptionalArray dh0,
                                 OptionalArray dA_log, OptionalArray ddt_bias) {
  return {view(q, "q"),
          view(k, "k"),
          view(v, "v"),
          view(g, "g"),
          view(beta, "beta"),
          view(initial_state, "initial_state"),
          view(cu_seqlens, "cu_seqlens"),
          view(A_log, "A_log"),
          view(dt_bias, "dt_bias"),
          view(dout, "dout"),
          view(dht, "dht"),
          view(dq, "dq"),
          view(dk, "dk"),
          view(dv, "dv"),
          view(dg, "dg"),
          view(dbeta, "dbeta"),
          view(dh0, "dh0"),
          view(dA_log, "dA_log"),
          view(ddt_bias, "ddt_bias")};
}

// A dense row-major descriptor of the given shape on the first CUDA device, for the size queries
// from shapes alone: they read shapes, dtypes and options, never data, so data is a placeholder
// (non-NULL marks the tensor present; aligned as the kernels require).
cakeTensor_t shape_only(cakeDtype_t dtype, std::vector<int64_t> const& shape) {
  if (shape.size() > CAKE_MAX_DIMS) {
    throw cake::Error(cakeInvalidArgument,
                      cake::concat("a shape has ", shape.size(),
                                   " dimensions; cake's tensors have at most ", CAKE_MAX_DIMS));
  }
  return cake::dense_view(placeholder(), dtype, cakeCUDA, shape);
}

// A byte query of the forward (workspace or saved set) as a Python function of the forward's
// arguments.
using ForwardQuery = cakeResult_t (*)(cakeOptions_t const*, cakeForwardArgs_t const*, size_t*);

template <ForwardQuery kQuery>
auto forward_query() {
  return [](CAKE_INPUT_PARAMS, OptionalArray o, OptionalArray final_state, CAKE_OPTION_PARAMS) {
    return result([&] {
      cakeOptions_t const opts = CAKE_OPTIONS;
      cakeForwardArgs_t const args = forward_args(q, k, v, g, beta, initial_state, cu_seqlens,
                                                  A_log, dt_bias, o, final_state);
      size_t bytes = 0;
      check(kQuery(&opts, &args, &bytes));
      return bytes;
    });
  };
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "cake's C ABI over DLPack tensors, every function returning (code, message, value); "
            "use the functions of the cake package instead.";

  m.def("forward_workspace_size", forward_query<cakeForwardWorkspaceSize>());
  m.def("forward_saved_size", forward_query<cakeForwardSavedSize>());

  // Whether device_type's implementation would run this forward (and its backward).
  m.def("check_support", [](CAKE_INPUT_PARAMS, OptionalArray o, OptionalArray final_state,
                            CAKE_OPTION_PARAMS, int device_type) {
    return result([&] {
      cakeOptions_t const opts = CAKE_OPTIONS;
      cakeForwardArgs_t const args = forward_args(q, k, v, g, beta, initial_state, cu_seqlens,
                                                  A_log, dt_bias, o, final_state);
      check(cakeCheckSupport(&opts, &args, device_type));
    });
  });

  m.def("build_info", [] { return result([] { return std::string(cakeGetBuildInfo()); }); });

  // The saved set's bytes of a forward on CUDA in a mode (variant: cakeGdn or cakeKda), from
  // shapes alone (for the fake implementation of cake::forward, whose tensors have no data):
  // q [B, T, H, K], v [B, T, HV, V], and N + 1 = cu_seqlens' length when given.
  m.def("cuda_saved_size_of_shapes",
        [](int variant, std::vector<int64_t> q_shape, std::vector<int64_t> v_shape,
           std::optional<int64_t> cu_seqlens_len, bool use_qk_l2norm, int save_for_backward) {
          return result([&] {
            cakeOptions_t const opts =
                options(static_cast<cakeVariant_t>(variant), 1.0, use_qk_l2norm, false,
                        std::nullopt, false, false, save_for_backward, false);
            cakeForwardArgs_t args{};
            args.q = shape_only(cakeBfloat16, q_shape);
            args.k = args.q;
            args.v = shape_only(cakeBfloat16, v_shape);
            std::vector<int64_t> row = {q_shape.size() > 0 ? q_shape[0] : 0,
                                        q_shape.size() > 1 ? q_shape[1] : 0,
                                        v_shape.size() > 2 ? v_shape[2] : 0};
            args.beta = shape_only(cakeFloat32, row);
            if (variant == cakeKda) row.push_back(q_shape.size() > 3 ? q_shape[3] : 0);
            args.g = shape_only(cakeFloat32, row);
            if (cu_seqlens_len) args.cu_seqlens = shape_only(cakeInt32, {*cu_seqlens_len});
            args.o = args.v;
            size_t bytes = 0;
            check(cakeForwardSavedSize(&opts, &args, &bytes));
            return bytes;
          });
        });

  m.def("forward", [](CAKE_INPUT_PARAMS, OptionalArray o, OptionalArray final_state,
                      CAKE_OPTION_PARAMS, OptionalArray saved, OptionalArray workspace,
                      uintptr_t stream) {
    return result([&] {
      cakeOptions_t const opts = CAKE_OPTIONS;
      cakeForwardArgs_t const args = forward_args(q, k, v, g, beta, initial_state, cu_seqlens,
                                                  A_log, dt_bias, o, final_state);
      auto const [sv, sv_bytes] = buffer_of(saved);
      auto const [ws, ws_bytes] = buffer_of(workspace);
      check_without_gil([&] {
        return cakeForward(&opts, &args, sv, sv_bytes, ws, ws_bytes,
                           reinterpret_cast<void*>(stream));
      });
    });
  });

  m.def("backward_workspace_size",
        [](CAKE_INPUT_PARAMS, OptionalArray dout, OptionalArray dht, OptionalArray dq,
           OptionalArray dk, OptionalArray dv, OptionalArray dg, OptionalArray dbeta,
           OptionalArray dh0, OptionalArray dA_log, OptionalArray ddt_bias, CAKE_OPTION_PARAMS) {
          return result([&] {
            cakeOptions_t const opts = CAKE_OPTIONS;
            cakeBackwardArgs_t const args =
                backward_args(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, dout,
                              dht, dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias);
            size_t bytes = 0;
            check(cakeBackwardWorkspaceSize(&opts, &args, &bytes));
            return bytes;
          });
        });

  m.def("backward", [](CAKE_INPUT_PARAMS, OptionalArray dout, OptionalArray dht, OptionalArray dq,
                       OptionalArray dk, OptionalArray dv, OptionalArray dg, OptionalArray dbeta,
                       OptionalArray dh0, OptionalArray dA_log, OptionalArray ddt_bias,
                       CAKE_OPTION_PARAMS, OptionalArray saved, OptionalArray workspace,
                       uintptr_t stream) {
    return result([&] {
      cakeOptions_t const opts = CAKE_OPTIONS;
      cakeBackwardArgs_t const args =
          backward_args(q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias, dout, dht,
                        dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias);
      auto const [sv, sv_bytes] = buffer_of(saved);
      auto const [ws, ws_bytes] = buffer_of(workspace);
      check_without_gil([&] {
        return cakeBackward(&opts, &args, sv, sv_bytes, ws, ws_bytes,
                            reinterpret_cast<void*>(stream));
      });
    });
  });
  bind_kcp(m);
  bind_conv1d(m);
  bind_norm(m);
}
