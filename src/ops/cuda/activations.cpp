// The in-op activations around the delta rule's GPU path. With use_gate_in_kernel or
// use_beta_sigmoid_in_kernel, the forward activates g and beta into its workspace (fp32, what the
// delta rule's kernels read) and runs the op on those with both options off. The backward
// activates them again (the op's recompute reads them, and the activations' backward needs
// nothing else from the forward), runs the op's backward with dg and dbeta into its workspace,
// and takes those back through the activations: dg_raw, dA_log, ddt_bias and dbeta_raw into the
// caller's gradients (src/kernels/gate). The op's saved set is the one of its own options:
// nothing of the activations is kept between the two calls.
//
// Workspace: [g fp32 [BT, HV, W] | beta fp32 [BT, HV] | the op's workspace] in the forward;
// [g | beta | dg fp32 | dbeta fp32 | the tiles' sums fp32 [tiles, 2, HV W] | the op's workspace]
// in the backward, each region only where it is used.
#include "core/tensor.hpp"
#include "kernels/gate/launch.hpp"
#include "ops/activations_cuda.hpp"
#include "ops/cuda/device_guard.hpp"
#include "ops/cuda/stages.hpp"
#include "ops/gdn_cuda.hpp"
#include "ops/kda_cuda.hpp"

namespace cake::ops {

namespace {

using namespace cuda;

bool activates(cakeOptions_t const& o) { return o.use_gate_in_kernel || o.use_beta_sigmoid; }

// The options the delta rule's path gets once g and beta are activated.
cakeOptions_t op_options(cakeOptions_t o) {
  o.use_gate_in_kernel = 0;
  o.has_lower_bound = 0;
  o.lower_bound = 0;
  o.use_beta_sigmoid = 0;
  o.allow_neg_eigval = 0;
  return o;
}

// The delta rule's GPU path of a variant.
struct Op {
  decltype(&gdn_cuda_saved_bytes) saved_bytes;
  decltype(&gdn_cuda_forward_workspace_bytes) forward_workspace_bytes;
  decltype(&gdn_cuda_forward) forward;
  decltype(&gdn_cuda_backward_workspace_bytes) backward_workspace_bytes;
  decltype(&gdn_cuda_backward) backward;
};
Op op_of(cakeOptions_t const& o) {
  if (o.variant == cakeKda)
    return {kda_cuda_saved_bytes, kda_cuda_forward_workspace_bytes, kda_cuda_forward,
            kda_cuda_backward_workspace_bytes, kda_cuda_backward};
  return {gdn_cuda_saved_bytes, gdn_cuda_forward_workspace_bytes, gdn_cuda_forward,
          gdn_cuda_backward_workspace_bytes, gdn_cuda_backward};
}

// t as a dense fp32 tensor of the same shape at data.
cakeTensor_t as_float32(cakeTensor_t t, float* data) {
  t.data = data;
  t.dtype = cakeFloat32;
  return t;
}

// The activations' shapes and inputs of a call (the forward's and the backward's alike).
template <class Args>
kernels::gate::Params gate_params(cakeOptions_t const& o, Args const& args) {
  kernels::gate::Params p;
  p.num_tokens = args.v.shape[0] * args.v.shape[1];
  p.num_v_heads = static_cast<int32_t>(args.v.shape[2]);
  p.width = o.variant == cakeKda ? static_cast<int32_t>(args.g.shape[3]) : 1;
  if (o.use_gate_in_kernel) {
    p.activate_g = true;
    p.g_raw = args.g.data;
    p.g_dtype = args.g.dtype;
    p.A_log = args.A_log.data;
    p.A_log_dtype = args.A_log.dtype;
    p.dt_bias = args.dt_bias.data;
    p.dt_bias_dtype = args.dt_bias.dtype;
    p.has_lower_bound = o.has_lower_bound != 0;
    p.lower_bound = static_cast<float>(o.lower_bound);
  }
  if (o.use_beta_sigmoid) {
    p.activate_beta = true;
    p.beta_raw = args.beta.data;
    p.beta_dtype = args.beta.dtype;
    p.beta_c = o.allow_neg_eigval ? 2.f : 1.f;
  }
  return p;
}

int64_t gate_elements(kernels::gate::Params const& p) {
  return p.num_tokens * p.num_v_heads * p.width;
}
int64_t beta_elements(kernels::gate::Params const& p) { return p.num_tokens * p.num_v_heads; }

// The activated g and beta (fp32, where activated) carved first from a workspace.
struct Activated {
  float* g = nullptr;
  float* beta = nullptr;
};
Activated take_activated(Carver& c, kernels::gate::Params const& p) {
  Activated a;
  if (p.activate_g) a.g = c.take<float>(gate_elements(p));
  if (p.activate_beta) a.beta = c.take<float>(beta_elements(p));
  return a;
}

// The backward's own buffers after the activated inputs.
struct Gradients {
  bool wants_dg = false, wants_dbeta = false;
  float* dg = nullptr;
  float* dbeta = nullptr;
  float* partials = nullptr;
};
Gradients take_gradients(Carver& c, kernels::gate::Params const& p,
                         cakeBackwardArgs_t const& args) {
  Gradients d;
  bool const sums = present(args.dA_log) || present(args.ddt_bias);
  d.wants_dg = p.activate_g && (present(args.dg) || sums);
  d.wants_dbeta = p.activate_beta && present(args.dbeta);
  if (d.wants_dg) d.dg = c.take<float>(gate_elements(p));
  if (d.wants_dbeta) d.dbeta = c.take<float>(beta_elements(p));
  if (p.activate_g && sums) {
    d.partials = c.take<float>(
        kernels::gate::partials_elements(p.num_tokens, int64_t{p.num_v_heads} * p.width));
  }
  return d;
}

cakeForwardArgs_t op_forward_args(cakeForwardArgs_t args, Activated const& a,
                                  kernels::gate::Params const& p) {
  if (p.activate_g) args.g = as_float32(args.g, a.g);
  if (p.activate_beta) args.beta = as_float32(args.beta, a.beta);
  args.A_log = args.dt_bias = cakeTensor_t{};
  return args;
}

cakeBackwardArgs_t op_backward_args(cakeBackwardArgs_t args, Activated const& a, Gradients const& d,
                                    kernels::gate::Params const& p) {
  // dg and dbeta into the workspace where the activations' backward needs them, else absent
  if (p.activate_g) {
    args.dg = d.wants_dg ? as_float32(args.g, d.dg) : cakeTensor_t{};
    args.g = as_float32(args.g, a.g);
  }
  if (p.activate_beta) {
    args.dbeta = d.wants_dbeta ? as_float32(args.beta, d.dbeta) : cakeTensor_t{};
    args.beta = as_float32(args.beta, a.beta);
  }
  args.A_log = args.dt_bias = args.dA_log = args.ddt_bias = cakeTensor_t{};
  return args;
}

// The op's workspace: the rest of the caller's, after the activations' regions.
struct Rest {
  void* data;
  size_t bytes;
};
Rest take_rest(Carver& c, size_t op_bytes) { return {c.take<char>(op_bytes), op_bytes}; }

// A pass's workspace, counted (workspace nullptr) or carved, by one function per pass, so that
// the size query and the run carve the same regions.
struct ForwardLayout {
  Activated a;
  cakeForwardArgs_t op_args;
  Rest rest;
  size_t bytes;
};
ForwardLayout forward_layout(Op const& op, cakeOptions_t const& options,
                             cakeForwardArgs_t const& args, kernels::gate::Params const& p,
                             void* workspace) {
  Carver c(workspace, Carver::kRelocatable);
  ForwardLayout l;
  l.a = take_activated(c, p);
  l.op_args = op_forward_args(args, l.a, p);
  l.rest = take_rest(c, op.forward_workspace_bytes(op_options(options), l.op_args));
  l.bytes = c.bytes();
  return l;
}

struct BackwardLayout {
  Activated a;
  Gradients d;
  cakeBackwardArgs_t op_args;
  Rest rest;
  size_t bytes;
};
BackwardLayout backward_layout(Op const& op, cakeOptions_t const& options,
                               cakeBackwardArgs_t const& args, kernels::gate::Params const& p,
                               void* workspace) {
  Carver c(workspace, Carver::kRelocatable);
  BackwardLayout l;
  l.a = take_activated(c, p);
  l.d = take_gradients(c, p, args);
  l.op_args = op_backward_args(args, l.a, l.d, p);
  l.rest = take_rest(c, op.backward_workspace_bytes(op_options(options), l.op_args));
  l.bytes = c.bytes();
  return l;
}

}  // namespace

size_t cuda_saved_bytes(cakeOptions_t const& options, cakeTensor_t const& q, cakeTensor_t const& v,
                        cakeTensor_t const& cu_seqlens) {
  return op_of(options).saved_bytes(op_options(options), q, v, cu_seqlens);
}

size_t cuda_forward_workspace_bytes(cakeOptions_t const& options, cakeForwardArgs_t const& args) {
  Op const op = op_of(options);
  if (!activates(options)) return op.forward_workspace_bytes(options, args);
  return forward_layout(op, options, args, gate_params(options, args), nullptr).bytes;
}

void cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, void* saved,
                  void* workspace, size_t workspace_bytes, void* stream) {
  cuda::DeviceGuard const device(args.q.device_id);
  Op const op = op_of(options);
  if (!activates(options))
    return op.forward(options, args, saved, workspace, workspace_bytes, stream);
  auto p = gate_params(options, args);
  ForwardLayout const l = forward_layout(op, options, args, p, workspace);
  check_workspace(workspace, l.bytes, workspace_bytes);
  p.g = l.a.g;
  p.beta = l.a.beta;
  check_cuda(kernels::gate::launch_forward(p, static_cast<cudaStream_t>(stream)),
             "gate forward launch");
  op.forward(op_options(options), l.op_args, saved, l.rest.data, l.rest.bytes, stream);
}

size_t cuda_backward_workspace_bytes(cakeOptions_t const& options, cakeBackwardArgs_t const& args) {
  Op const op = op_of(options);
  if (!activates(options)) return op.backward_workspace_bytes(options, args);
  return backward_layout(op, options, args, gate_params(options, args), nullptr).bytes;
}

void cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args, void const* saved,
                   void* workspace, size_t workspace_bytes, void* stream) {
  cuda::DeviceGuard const device(args.q.device_id);
  Op const op = op_of(options);
  if (!activates(options))
    return op.backward(options, args, saved, workspace, workspace_bytes, stream);
  auto p = gate_params(options, args);
  BackwardLayout const l = backward_layout(op, options, args, p, workspace);
  check_workspace(workspace, l.bytes, workspace_bytes);
  auto const s = static_cast<cudaStream_t>(stream);
  p.g = l.a.g;
  p.beta = l.a.beta;
  check_cuda(kernels::gate::launch_forward(p, s), "gate forward launch");
  op.backward(op_options(options), l.op_args, saved, l.rest.data, l.rest.bytes, stream);
  p.dg = l.d.dg;
  p.dg_raw = args.dg.data;
  p.dA_log = args.dA_log.data;
  p.ddt_bias = args.ddt_bias.data;
  p.partials = l.d.partials;
  p.dbeta = l.d.dbeta;
  p.dbeta_raw = args.dbeta.data;
  check_cuda(kernels::gate::launch_backward(p, s), "gate backward launch");
}

}  // namespace cake::ops
