// The GDN GPU path: validated arguments -> Problem -> buffer layout -> the stages in order.
//
// Forward:  [qk_norm] -> kkt_solve (G, A = (I + diag(beta) L)^-1) -> [saved mode: intra_fwd (T,
//           W, U) -> state_fwd (h, Delta), the saved set as the backward's recompute makes it] ->
//           walk_a_fwd (o and the final state, one walk rebuilding Delta from A)
// Backward: the saved set (normalised q/k, G, T, W, h, Delta) comes from the forward or from its
//           recompute [qk_norm] -> intra_fwd -> state_fwd (h, Delta: the walk without o), then
//           dv_local_bwd (dDelta intra) -> state_bwd (dh per chunk, dDelta, dh0) -> dqk_bwd (dq,
//           dk partial per q/k head, dW, dG partial) -> wy_bwd (dk's WY terms per value head, dv,
//           dbeta, dg) -> qk_grad (dk's value-head sum, L2-norm backward).
// Two modes (options.save_for_backward): in recompute mode the backward reruns [qk_norm] ->
// intra_fwd (+ T) -> state_fwd into its workspace; in saved mode the forward runs the same two
// stages into the caller's saved buffer and the backward reads it from there. Same kernels on the
// same inputs, so the modes agree bitwise (o comes from walk_a_fwd in both).
// docs/design/gdn-hopper.md says why the work is split this way.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/error.hpp"
#include "kernels/dqk_bwd/launch.hpp"
#include "kernels/dv_local_bwd/launch.hpp"
#include "kernels/intra_fwd/launch.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/qk_grad/launch.hpp"
#include "kernels/qk_norm/launch.hpp"
#include "kernels/state_bwd/launch.hpp"
#include "kernels/state_fwd/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/wy_bwd/launch.hpp"
#include "ops/cuda/gdn_workspace.hpp"
#include "ops/gdn_cuda.hpp"

namespace cake::ops {

namespace {

using bf16 = __nv_bfloat16;
using kernels::Problem;

void check_cuda(cudaError_t err, char const* what) {
  if (err != cudaSuccess)
    throw Error(cakeCudaError, concat(what, ": ", cudaGetErrorName(err), " (",
                                      cudaGetErrorString(err), ")"));
}

template <class T>
T* ptr(cakeTensor_t const& t) {
  return static_cast<T*>(t.data);
}

// Shapes of q [B, T, H, K], v [B, T, HV, V], cu_seqlens [N + 1] (seam-validated) -> Problem.
Problem make_problem(cakeOptions_t const& options, cakeTensor_t const& q, cakeTensor_t const& v,
                     cakeTensor_t const& cu_seqlens) {
  CAKE_CHECK(q.shape[3] == kernels::kHeadDim && v.shape[3] == kernels::kHeadDim, cakeNotSupported,
             "the GDN CUDA kernels are built for K = V = ", kernels::kHeadDim, ", got K = ",
             q.shape[3], ", V = ", v.shape[3]);
  Problem p;
  p.num_tokens = q.shape[0] * q.shape[1];
  p.seq_len = q.shape[1];
  p.num_qk_heads = static_cast<int32_t>(q.shape[2]);
  p.num_v_heads = static_cast<int32_t>(v.shape[2]);
  if (cu_seqlens.data != nullptr) {
    p.num_seqs = static_cast<int32_t>(cu_seqlens.shape[0] - 1);
    if (cu_seqlens.dtype == cakeInt64)
      p.cu_seqlens64 = ptr<int64_t const>(cu_seqlens);
    else
      p.cu_seqlens32 = ptr<int32_t const>(cu_seqlens);
  } else {
    p.num_seqs = static_cast<int32_t>(q.shape[0]);
  }
  p.num_slots = p.num_tokens / kernels::kChunk + p.num_seqs + 1;
  p.scale = static_cast<float>(options.scale);
  return p;
}

// The kernels read q, k, v, dout in 16-byte vectors (cp.async) and write o, dq, dk, dv in bf16
// pairs, so those base addresses must be aligned (a contiguous view at an odd offset is not).
void check_aligned(char const* name, cakeTensor_t const& t, uintptr_t bytes) {
  CAKE_CHECK(t.data == nullptr || reinterpret_cast<uintptr_t>(t.data) % bytes == 0,
             cakeNotSupported, name, " must be ", bytes,
             "-byte aligned for the CUDA kernels, got address ", t.data);
}

bool empty(Problem const& p) {
  return p.num_seqs == 0 || p.num_v_heads == 0;
}

// The inputs of the forward's stages (the forward's own, or the backward's for its recompute).
struct ForwardInputs {
  cakeTensor_t const* q;
  cakeTensor_t const* k;
  cakeTensor_t const* v;
  cakeTensor_t const* g;
  cakeTensor_t const* beta;
  cakeTensor_t const* initial_state;
};

// The q, k the later stages read: normalised copies (qk_norm) with use_qk_l2norm, else the inputs.
void normalize_qk(Problem const& p, bool use_qk_l2norm, ForwardInputs const& in,
                  ops::cuda::GdnBuffers const& b, cudaStream_t stream, bf16 const** q_used,
                  bf16 const** k_used) {
  *q_used = ptr<bf16 const>(*in.q);
  *k_used = ptr<bf16 const>(*in.k);
  if (!use_qk_l2norm) return;
  kernels::qk_norm::Params np;
  np.num_rows = p.num_tokens * p.num_qk_heads;
  np.q = *q_used;
  np.k = *k_used;
  np.q_norm = b.q_norm;
  np.k_norm = b.k_norm;
  check_cuda(kernels::qk_norm::launch(np, stream), "qk_norm launch");
  *q_used = b.q_norm;
  *k_used = b.k_norm;
}

// The backward's set from the inputs: intra_fwd (G, T, W, U) -> state_fwd (h and Delta per
// chunk). The saved-mode forward and the recompute-mode backward both run exactly this.
void run_saved_set_stages(Problem const& p, ForwardInputs const& in, bf16 const* k_used,
                          ops::cuda::GdnBuffers const& b, cudaStream_t stream) {
  kernels::intra_fwd::Params ip;
  ip.problem = p;
  ip.k = k_used;
  ip.v = ptr<bf16 const>(*in.v);
  ip.g = ptr<float const>(*in.g);
  ip.beta = in.beta->data;
  ip.beta_is_bf16 = in.beta->dtype == cakeBfloat16;
  ip.gcum = b.gcum;
  ip.w = b.w;
  ip.u = b.u;
  ip.tmat = b.tmat;
  check_cuda(kernels::intra_fwd::launch(ip, stream), "intra_fwd launch");

  kernels::state_fwd::Params fp;
  fp.problem = p;
  fp.k = k_used;
  fp.w = b.w;
  fp.u = b.u;
  fp.gcum = b.gcum;
  fp.h0 = ptr<float const>(*in.initial_state);
  fp.h = b.h;
  fp.v_new = b.v_new;
  check_cuda(kernels::state_fwd::launch(fp, stream), "state_fwd launch");
}

using cuda::Pass;

bool saved_mode(cakeOptions_t const& options) {
  return options.save_for_backward != 0;
}

// The layout's sizes for a call (null bases: counting only).
cuda::GdnBuffers count_buffers(cakeOptions_t const& options, Problem const& p, Pass pass) {
  return cuda::carve_gdn_buffers(p, options.use_qk_l2norm != 0, pass, saved_mode(options),
                                 nullptr, nullptr);
}

// The buffers of one call, carved from the caller's saved buffer (its size checked by
// validate_saved against the same layout's count) and workspace, after checking the workspace
// holds the bytes that the size query (the same layout function) asked for and that the saved
// buffer is aligned as the layout assumes.
cuda::GdnBuffers bind_buffers(cakeOptions_t const& options, Problem const& p, Pass pass,
                              void* saved, void* workspace, size_t workspace_bytes) {
  cuda::GdnBuffers const count = count_buffers(options, p, pass);
  CAKE_CHECK(workspace_bytes >= count.workspace_bytes, cakeInsufficientWorkspace,
             "workspace: expected at least ", count.workspace_bytes, " bytes, got ",
             workspace_bytes);
  CAKE_CHECK(count.saved_bytes == 0 || reinterpret_cast<uintptr_t>(saved) % cuda::kSavedAlign == 0,
             cakeInvalidArgument, "saved must be ", cuda::kSavedAlign,
             "-byte aligned (the saved set's layout does not depend on its address), got address ",
             saved);
  return cuda::carve_gdn_buffers(p, options.use_qk_l2norm != 0, pass, saved_mode(options), saved,
                                 workspace);
}

}  // namespace

size_t gdn_cuda_saved_bytes(cakeOptions_t const& options, cakeTensor_t const& q,
                            cakeTensor_t const& v, cakeTensor_t const& cu_seqlens) {
  // The forward's count: the backward carves the saved set in the same order (layout function).
  return count_buffers(options, make_problem(options, q, v, cu_seqlens), Pass::kForward)
      .saved_bytes;
}

size_t gdn_cuda_forward_workspace_bytes(cakeOptions_t const& options,
                                        cakeForwardArgs_t const& args) {
  Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  return count_buffers(options, p, Pass::kForward).workspace_bytes;
}

void gdn_cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, void* saved,
                      void* workspace, size_t workspace_bytes, void* stream_ptr) {
  Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  bool const l2 = options.use_qk_l2norm != 0;
  check_aligned("q", args.q, 16);
  check_aligned("k", args.k, 16);
  check_aligned("v", args.v, 16);
  check_aligned("o", args.o, 4);
  auto const b = bind_buffers(options, p, Pass::kForward, saved, workspace, workspace_bytes);
  if (empty(p)) return;
  auto const stream = static_cast<cudaStream_t>(stream_ptr);

  ForwardInputs const in{&args.q, &args.k, &args.v, &args.g, &args.beta, &args.initial_state};
  bf16 const* q_used = nullptr;
  bf16 const* k_used = nullptr;
  normalize_qk(p, l2, in, b, stream, &q_used, &k_used);

  // G and the un-gated inverse A per (chunk, value head); beta in fp32 for the walk.
  kernels::kkt_solve::Params kp;
  kp.problem = p;
  kp.k = k_used;
  kp.g = ptr<float const>(args.g);
  kp.beta = args.beta.data;
  kp.beta_is_bf16 = args.beta.dtype == cakeBfloat16;
  kp.gcum = b.gcum;
  kp.beta_f32 = b.beta_f32;
  kp.a = b.a;
  check_cuda(kernels::kkt_solve::launch(kp, stream), "kkt_solve launch");

  // Saved mode: the backward's set, by the stages its recompute would run (bitwise the same).
  // Before the walk, so that both read the initial state before the walk writes the final one
  // (a caller may pass one tensor as both).
  if (saved_mode(options)) run_saved_set_stages(p, in, k_used, b, stream);

  // The walk writes o and the final state.
  kernels::walk_a_fwd::Params wp;
  wp.problem = p;
  wp.q = q_used;
  wp.k = k_used;
  wp.v = ptr<bf16 const>(args.v);
  wp.a = b.a;
  wp.gcum = b.gcum;
  wp.beta = b.beta_f32;
  wp.h0 = ptr<float const>(args.initial_state);
  wp.o = ptr<bf16>(args.o);
  wp.ht = ptr<float>(args.final_state);
  check_cuda(kernels::walk_a_fwd::launch(wp, stream), "walk_a_fwd launch");
}

size_t gdn_cuda_backward_workspace_bytes(cakeOptions_t const& options,
                                         cakeBackwardArgs_t const& args) {
  Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  return count_buffers(options, p, Pass::kBackward).workspace_bytes;
}

void gdn_cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                       void const* saved, void* workspace, size_t workspace_bytes,
                       void* stream_ptr) {
  Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  bool const l2 = options.use_qk_l2norm != 0;
  check_aligned("q", args.q, 16);
  check_aligned("k", args.k, 16);
  check_aligned("v", args.v, 16);
  check_aligned("dout", args.dout, 16);
  check_aligned("dq", args.dq, 4);
  check_aligned("dk", args.dk, 4);
  check_aligned("dv", args.dv, 4);
  // The carve hands out mutable pointers; in saved mode the backward only passes the saved set's
  // regions to kernel inputs (const parameters) and writes dW to its own workspace region.
  auto const b = bind_buffers(options, p, Pass::kBackward, const_cast<void*>(saved), workspace,
                              workspace_bytes);
  if (empty(p)) return;
  auto const stream = static_cast<cudaStream_t>(stream_ptr);

  bf16 const* q_used = l2 ? b.q_norm : ptr<bf16 const>(args.q);
  bf16 const* k_used = l2 ? b.k_norm : ptr<bf16 const>(args.k);
  if (!saved_mode(options)) {
    ForwardInputs const in{&args.q, &args.k, &args.v, &args.g, &args.beta, &args.initial_state};
    normalize_qk(p, l2, in, b, stream, &q_used, &k_used);
    run_saved_set_stages(p, in, k_used, b, stream);
  }

  if (p.num_tokens > 0) {
    kernels::dv_local_bwd::Params lp;
    lp.problem = p;
    lp.q = q_used;
    lp.k = k_used;
    lp.gcum = b.gcum;
    lp.dout = ptr<bf16 const>(args.dout);
    lp.dv_new = b.dv_new;
    check_cuda(kernels::dv_local_bwd::launch(lp, stream), "dv_local_bwd launch");
  }

  kernels::state_bwd::Params sp;
  sp.problem = p;
  sp.q = q_used;
  sp.k = k_used;
  sp.w = b.w;
  sp.gcum = b.gcum;
  sp.dout = ptr<bf16 const>(args.dout);
  sp.dht = ptr<float const>(args.dht);
  sp.dh = b.dh;
  sp.dv_new = b.dv_new;
  sp.dh0 = ptr<float>(args.dh0);
  check_cuda(kernels::state_bwd::launch(sp, stream), "state_bwd launch");
  if (p.num_tokens == 0) return;

  // dW: W's own buffer in recompute mode (W is dead once state_bwd has run), else a workspace
  // region (the layout decides).
  bf16* const dw = b.dw;
  kernels::dqk_bwd::Params qp;
  qp.problem = p;
  qp.q = q_used;
  qp.k = k_used;
  qp.v_new = b.v_new;
  qp.gcum = b.gcum;
  qp.dout = ptr<bf16 const>(args.dout);
  qp.h = b.h;
  qp.dh = b.dh;
  qp.dv_new = b.dv_new;
  qp.dq_h = b.dq_h;
  qp.dk_h = b.dk_h;
  qp.dw = dw;
  qp.dg_part = b.dg_part;
  check_cuda(kernels::dqk_bwd::launch(qp, stream), "dqk_bwd launch");

  kernels::wy_bwd::Params wp;
  wp.problem = p;
  wp.k = k_used;
  wp.v = ptr<bf16 const>(args.v);
  wp.beta = args.beta.data;
  wp.beta_is_bf16 = args.beta.dtype == cakeBfloat16;
  wp.gcum = b.gcum;
  wp.tmat = b.tmat;
  wp.dw = dw;
  wp.dv_new = b.dv_new;
  wp.dk_wy_hv = b.dk_wy_hv;
  wp.dg_part = b.dg_part;
  wp.dv = ptr<bf16>(args.dv);
  wp.dbeta = args.dbeta.data;
  wp.dbeta_is_bf16 = args.dbeta.dtype == cakeBfloat16;
  wp.dg = ptr<float>(args.dg);
  check_cuda(kernels::wy_bwd::launch(wp, stream), "wy_bwd launch");

  kernels::qk_grad::Params gp;
  gp.num_tokens = p.num_tokens;
  gp.num_qk_heads = p.num_qk_heads;
  gp.group_size = p.group_size();
  gp.use_l2norm = l2;
  gp.q = ptr<bf16 const>(args.q);
  gp.k = ptr<bf16 const>(args.k);
  gp.dq_h = b.dq_h;
  gp.dk_h = b.dk_h;
  gp.dk_wy_hv = b.dk_wy_hv;
  gp.dq = ptr<bf16>(args.dq);
  gp.dk = ptr<bf16>(args.dk);
  check_cuda(kernels::qk_grad::launch(gp, stream), "qk_grad launch");
}

}  // namespace cake::ops
