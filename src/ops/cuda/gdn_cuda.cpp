// The GDN GPU path: validated arguments -> Problem -> buffer layout -> the stages in order.
//
// Forward:  [qk_norm] -> kkt_solve (G, A = (I + diag(beta) L)^-1, beta in fp32) -> walk_a_fwd
//           (o, the final state; in saved mode also h per chunk)
// Backward: the saved set (normalised q/k and their rows' rstd, G, A, beta, h per chunk) comes
//           from the forward or from its recompute [qk_norm] -> kkt_solve -> the h-walk
//           (walk_a_fwd without o); then walk_a_bwd (one reverse walk: dq, dk summed over the
//           value heads in ascending order, dv, dbeta, dg, dh0) -> qk_grad (dq, dk to bf16,
//           L2-norm backward from q̂, k̂ and rstd). Where the reverse walks do not fill the device
//           (reverse_form), the reverse walk is split: walk_a_bwd's dS-walk (dS per chunk, dh0)
//           beside the h-walk, then its chunk pass (the other gradients, one CTA per chunk and
//           value head, dq and dk summed as the walk sums them).
// Three modes (options.save_for_backward): in recompute mode the backward reruns [qk_norm],
// kkt_solve and the h-walk into its workspace; in saved mode the forward's kkt_solve and walk
// write all of it into the caller's saved buffer and the backward reads it from there; in inverse
// mode the saved buffer holds all but h ([q̂, k̂, rstd], G, A, beta) and the backward reruns the
// h-walk. The same kernels on the same inputs (the h-walk's h is the forward walk's, product for
// product), so the modes agree bitwise. With use_qk_l2norm the backward of the saved and inverse
// modes reads no element of q or k (include/cake/cake.h), so a caller need not keep them.
// docs/design/gdn-hopper.md says why the work is split this way.
#include "ops/gdn_cuda.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/error.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "ops/cuda/gdn_workspace.hpp"
#include "ops/cuda/stages.hpp"
#include "ops/support.hpp"

namespace cake::ops {

namespace {

using kernels::Problem;
using namespace cuda;

// G, A and beta in fp32 per (chunk, value head): the first stage of the forward and of the
// backward's recompute.
void run_kkt_solve(Problem const& p, ForwardInputs const& in, bf16 const* k_used,
                   GdnBuffers const& b, cudaStream_t stream) {
  kernels::kkt_solve::Params kp;
  kp.problem = p;
  kp.k = k_used;
  kp.g = ptr<float const>(*in.g);
  kp.beta = in.beta->data;
  kp.beta_is_bf16 = in.beta->dtype == cakeBfloat16;
  kp.gcum = b.gcum;
  kp.beta_f32 = b.beta_f32;
  kp.a = b.a;
  check_cuda(kernels::kkt_solve::launch<kernels::ScalarDecay>(kp, stream), "kkt_solve launch");
}

// The forward walk: o and ht when o is given (the forward), h per chunk when h is given (saved
// mode, or the backward's h-walk with o == nullptr).
void run_walk(Problem const& p, ForwardInputs const& in, bf16 const* q_used, bf16 const* k_used,
              GdnBuffers const& b, bf16* o, float* ht, bf16* h, int* walk_done,
              cudaStream_t stream) {
  kernels::walk_a_fwd::Params wp;
  wp.problem = p;
  wp.q = q_used;
  wp.k = k_used;
  wp.v = ptr<bf16 const>(*in.v);
  wp.a = b.a;
  wp.gcum = b.gcum;
  wp.beta = b.beta_f32;
  wp.h0 = ptr<float const>(*in.initial_state);
  wp.o = o;
  wp.ht = ht;
  wp.h = h;
  wp.walk_done = walk_done;
  check_cuda(kernels::walk_a_fwd::launch<kernels::ScalarDecay>(wp, stream), "walk_a_fwd launch");
}

}  // namespace

size_t gdn_cuda_saved_bytes(cakeOptions_t const& options, cakeTensor_t const& q,
                            cakeTensor_t const& v, cakeTensor_t const& cu_seqlens) {
  return saved_bytes_of(carve_gdn_buffers, options, q, v, cu_seqlens);
}

size_t gdn_cuda_forward_workspace_bytes(cakeOptions_t const& options,
                                        cakeForwardArgs_t const& args) {
  return forward_workspace_bytes_of(carve_gdn_buffers, options, args);
}

void gdn_cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, void* saved,
                      void* workspace, size_t workspace_bytes, void* stream_ptr) {
  Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  bool const l2 = options.use_qk_l2norm != 0;
  check_aligned("q", args.q, 16);
  check_aligned("k", args.k, 16);
  check_aligned("v", args.v, 16);
  check_aligned("o", args.o, 4);
  check_aligned("initial_state", args.initial_state, 8);
  check_aligned("final_state", args.final_state, 8);
  auto const b = bind_buffers(layout_for(carve_gdn_buffers, ReverseForm::kWalk), options, p,
                              Pass::kForward, saved, workspace, workspace_bytes);
  if (empty(p)) return;
  auto const stream = static_cast<cudaStream_t>(stream_ptr);
  if (pass_states_without_tokens(p, args.initial_state, args.final_state, stream)) return;

  ForwardInputs const in{&args.q, &args.k, &args.v, &args.g, &args.beta, &args.initial_state};
  bf16 const* q_used = nullptr;
  bf16 const* k_used = nullptr;
  normalize_qk(p, l2, in, b, stream, &q_used, &k_used);

  // G and the un-gated inverse A per (chunk, value head); beta in fp32 for the walk (into the
  // saved set in saved and inverse modes). Then the walk: o and the final state, and in saved mode
  // h per chunk for the backward.
  run_kkt_solve(p, in, k_used, b, stream);
  run_walk(p, in, q_used, k_used, b, ptr<bf16>(args.o), ptr<float>(args.final_state),
           save_mode(options) == SaveMode::kSaved ? b.h : nullptr, nullptr, stream);
}

size_t gdn_cuda_backward_workspace_bytes(cakeOptions_t const& options,
                                         cakeBackwardArgs_t const& args) {
  return backward_workspace_bytes_of(carve_gdn_buffers, options, args);
}

void gdn_cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                       void const* saved, void* workspace, size_t workspace_bytes,
                       void* stream_ptr) {
  Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  bool const l2 = options.use_qk_l2norm != 0;
  if (cuda_backward_reads_qk(options)) {
    check_aligned("q", args.q, 16);
    check_aligned("k", args.k, 16);
  }
  check_aligned("v", args.v, 16);
  check_aligned("dout", args.dout, 16);
  check_aligned("dq", args.dq, 4);
  check_aligned("dk", args.dk, 4);
  check_aligned("dv", args.dv, 4);
  check_aligned("dht", args.dht, 8);
  check_aligned("dh0", args.dh0, 8);
  // The carve hands out mutable pointers; in saved and inverse modes the backward only passes the
  // saved arena's regions to kernel inputs (const parameters).
  ReverseForm const form = reverse_form(p, args.dout.device_id);
  auto const b = bind_buffers(layout_for(carve_gdn_buffers, form), options, p, Pass::kBackward,
                              const_cast<void*>(saved), workspace, workspace_bytes);
  if (empty(p)) return;
  auto const stream = static_cast<cudaStream_t>(stream_ptr);
  if (pass_states_without_tokens(p, args.dht, args.dh0, stream)) return;

  bf16 const* q_used = l2 ? b.q_norm : ptr<bf16 const>(args.q);
  bf16 const* k_used = l2 ? b.k_norm : ptr<bf16 const>(args.k);
  // The value-head sums' state, cleared before the h-walk: the reverse walk is the h-walk's
  // programmatic dependent, which a launch between the two would break. The ordered sum's tickets
  // and turns; or, unordered (only where there is a sum: group size > 1), the sums, which every
  // value head then adds to.
  bool const unordered = options.unordered_sums != 0 && p.group_size() > 1;
  if (unordered) {
    size_t const sum_bytes = sizeof(float) * p.num_tokens * p.num_qk_heads * kernels::kHeadDim;
    check_cuda(cudaMemsetAsync(b.dq_sum, 0, sum_bytes, stream), "dq sum clear");
    check_cuda(cudaMemsetAsync(b.dk_sum, 0, sum_bytes, stream), "dk sum clear");
  } else if (b.walk_order != nullptr) {
    check_cuda(cudaMemsetAsync(b.walk_order, 0,
                               sizeof(int) * kernels::walk_a_bwd::walk_order_size(p), stream),
               "walk_a_bwd order clear");
  }

  SaveMode const mode = save_mode(options);
  if (mode != SaveMode::kSaved) {  // recompute what the saved set does not hold
    ForwardInputs const in{&args.q, &args.k, &args.v, &args.g, &args.beta, &args.initial_state};
    if (mode == SaveMode::kRecompute) {
      normalize_qk(p, l2, in, b, stream, &q_used, &k_used);
      run_kkt_solve(p, in, k_used, b, stream);
    }
    // the h-walk, with a flag per walk (cleared first, in stream order: capturable) that lets
    // each reverse walk start as soon as its own h is stored
    clear_walk_flags(b.walk_done, p, stream);
    run_walk(p, in, q_used, k_used, b, nullptr, nullptr, b.h, b.walk_done, stream);
  }

  kernels::walk_a_bwd::Params wp;
  wp.problem = p;
  wp.q = q_used;
  wp.k = k_used;
  wp.v = ptr<bf16 const>(args.v);
  wp.dout = ptr<bf16 const>(args.dout);
  wp.a = b.a;
  wp.gcum = b.gcum;
  wp.beta = b.beta_f32;
  wp.h = b.h;
  wp.h_ready = b.walk_done;  // nullptr in saved mode
  wp.dht = ptr<float const>(args.dht);
  wp.dq = b.dq_sum;
  wp.dk = b.dk_sum;
  wp.unordered_sum = unordered;
  wp.order = unordered ? nullptr : b.walk_order;
  wp.dv = ptr<bf16>(args.dv);
  wp.dbeta = args.dbeta.data;
  wp.dbeta_is_bf16 = args.dbeta.dtype == cakeBfloat16;
  wp.dg = ptr<float>(args.dg);
  wp.dh0 = ptr<float>(args.dh0);
  wp.eo_split = ptr<float const>(args.initial_state) != nullptr;
  run_reverse_walk<kernels::ScalarDecay>(wp, form, b.ds_end, stream);

  // dq, dk to bf16 (through the L2 norm's backward): summed over the value heads already
  reduce_qk_grads(p, l2, b, args, b.dq_sum, b.dk_sum, 1, stream);
}

}  // namespace cake::ops
