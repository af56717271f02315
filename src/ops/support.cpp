#include "ops/support.hpp"

#include <tuple>
#include <utility>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace cake::ops {

namespace {

void check_head_dims_cpu(Dims const& d) {
  CAKE_CHECK(d.head_dim_k >= 1 && d.head_dim_k <= 256 && d.head_dim_v >= 1 && d.head_dim_v <= 256,
             cakeNotSupported, "head dims must be in [1, 256] on the CPU, got K = ", d.head_dim_k,
             ", V = ", d.head_dim_v);
}

void check_dtype(char const* name, cakeTensor_t const& t, cakeDtype_t expected, char const* why) {
  CAKE_CHECK(t.dtype == expected, cakeInvalidArgument, name, " must be ", dtype_name(expected),
             " (", why, "), got ", dtype_name(t.dtype));
}

void check_contiguous(char const* name, cakeTensor_t const& t) {
  if (!present(t)) return;
  CAKE_CHECK(is_contiguous(t), cakeInvalidArgument, name,
             " must be contiguous for the CUDA kernels (call .contiguous()), got strides that are "
             "not row-major for shape ",
             shape_string(t));
}

// An input of the in-op activations (absent is fine: A_log and dt_bias are optional).
void check_activation_input(char const* name, cakeTensor_t const& t) {
  if (!present(t)) return;
  CAKE_CHECK(t.dtype == cakeFloat32 || t.dtype == cakeBfloat16 || t.dtype == cakeFloat16,
             cakeInvalidArgument, name,
             " must be float32, bfloat16 or float16 on CUDA with the in-op activations, got ",
             dtype_name(t.dtype));
}

// The inputs shared by the forward and the backward, as the kernels read them (GDN's and KDA's
// alike; the shared validation has checked g's shape for the variant). qk_elements_read: whether
// the call reads q's and k's elements (not so in GDN's backward with use_qk_l2norm in saved and
// inverse modes, whose saved set holds q̂, k̂ and rstd): where it does not, their strides are free
// (a caller may pass a one-element tensor expanded to the shape).
void check_cuda_inputs(cakeOptions_t const& options, cakeTensor_t const& q, cakeTensor_t const& k,
                       cakeTensor_t const& v, cakeTensor_t const& g, cakeTensor_t const& beta,
                       cakeTensor_t const& initial_state, cakeTensor_t const& cu_seqlens,
                       cakeTensor_t const& A_log, cakeTensor_t const& dt_bias, Dims const& d,
                       bool qk_elements_read) {
  CAKE_CHECK(d.head_dim_k == 128 && d.head_dim_v == 128, cakeNotSupported,
             "the CUDA kernels support head dims K = V = 128, got K = ", d.head_dim_k,
             ", V = ", d.head_dim_v);
  check_dtype("q", q, cakeBfloat16, "the CUDA kernels read bfloat16 q, k, v");
  // The in-op activations (src/kernels/gate) read float32, bfloat16 or float16 and write float32
  // for the delta rule's kernels.
  if (options.use_gate_in_kernel) {
    check_activation_input("g", g);
    check_activation_input("A_log", A_log);
    check_activation_input("dt_bias", dt_bias);
  } else {
    check_dtype("g", g, cakeFloat32, "the CUDA kernels read float32 g");
  }
  if (options.use_beta_sigmoid) {
    check_activation_input("beta", beta);
  } else {
    CAKE_CHECK(beta.dtype == cakeFloat32 || beta.dtype == cakeBfloat16, cakeInvalidArgument,
               "beta must be float32 or bfloat16 on CUDA, got ", dtype_name(beta.dtype));
  }
  if (present(initial_state)) {
    check_dtype("initial_state", initial_state, cakeFloat32, "states are float32 on CUDA");
  }
  for (auto [name, t] : {std::pair<char const*, cakeTensor_t const*>{"q", &q},
                         {"k", &k},
                         {"v", &v},
                         {"g", &g},
                         {"beta", &beta},
                         {"initial_state", &initial_state},
                         {"cu_seqlens", &cu_seqlens},
                         {"A_log", &A_log},
                         {"dt_bias", &dt_bias}}) {
    if (qk_elements_read || (t != &q && t != &k)) check_contiguous(name, *t);
  }
}

}  // namespace

char const* const kReferenceSupport =
    "FP64 reference: any float dtype (computed in float64), head dims 1..256, every option";

void check_reference_forward(cakeOptions_t const&, cakeForwardArgs_t const&, Dims const& d) {
  check_head_dims_cpu(d);
}

void check_reference_backward(cakeOptions_t const&, cakeBackwardArgs_t const&, Dims const& d) {
  check_head_dims_cpu(d);
}

bool cuda_backward_reads_qk(cakeOptions_t const& options) {
  return !(options.variant == cakeGdn && options.use_qk_l2norm && options.save_for_backward != 0);
}

char const* const kGdnCudaSupport =
    "sm_90a kernels: bfloat16 q, k, v, o, dout; float32 g; float32 or bfloat16 beta; float32 "
    "states; K = V = 128; contiguous tensors; int32 or int64 cu_seqlens; grouped value heads; "
    "use_qk_l2norm_in_kernel; use_gate_in_kernel (float32, bfloat16 or float16 g, A_log, "
    "dt_bias) and use_beta_sigmoid_in_kernel (float32, bfloat16 or float16 beta)";

char const* const kKdaCudaSupport =
    "sm_90a kernels: bfloat16 q, k, v, o, dout; float32 g [B, T, HV, K]; float32 or bfloat16 "
    "beta; float32 states; K = V = 128; contiguous tensors; int32 or int64 cu_seqlens; grouped "
    "value heads; use_qk_l2norm_in_kernel; use_gate_in_kernel (float32, bfloat16 or float16 g, "
    "A_log, dt_bias; lower_bound) and use_beta_sigmoid_in_kernel (float32, bfloat16 or "
    "float16 beta); saved mode keeps the whole saved set, inverse mode (the default) the chunk "
    "pass's products (G's last rows, A, beta, P)";

void check_cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args,
                        Dims const& d) {
  check_cuda_inputs(options, args.q, args.k, args.v, args.g, args.beta, args.initial_state,
                    args.cu_seqlens, args.A_log, args.dt_bias, d, true);
  check_dtype("o", args.o, cakeBfloat16, "the CUDA kernels write bfloat16 o");
  if (present(args.final_state)) {
    check_dtype("final_state", args.final_state, cakeFloat32, "states are float32 on CUDA");
  }
}

void check_cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                         Dims const& d) {
  check_cuda_inputs(options, args.q, args.k, args.v, args.g, args.beta, args.initial_state,
                    args.cu_seqlens, args.A_log, args.dt_bias, d, cuda_backward_reads_qk(options));
  check_dtype("dout", args.dout, cakeBfloat16, "the CUDA kernels read bfloat16 dout");
  if (present(args.dht)) check_dtype("dht", args.dht, cakeFloat32, "states are float32");
  for (auto [name, t, dtype] :
       {std::tuple<char const*, cakeTensor_t const*, cakeDtype_t>{"dq", &args.dq, args.q.dtype},
        {"dk", &args.dk, args.q.dtype},
        {"dv", &args.dv, args.q.dtype},
        {"dg", &args.dg, args.g.dtype},
        {"dbeta", &args.dbeta, args.beta.dtype},
        {"dh0", &args.dh0, cakeFloat32},
        {"dA_log", &args.dA_log, args.A_log.dtype},
        {"ddt_bias", &args.ddt_bias, args.dt_bias.dtype}}) {
    if (present(*t)) check_dtype(name, *t, dtype, "gradients take their input's dtype");
  }
}

}  // namespace cake::ops
