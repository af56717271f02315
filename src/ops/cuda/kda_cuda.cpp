// The KDA GPU path: validated arguments -> Problem -> buffer layout -> the stages in order, the
// decay a policy of GDN's kernels (docs/design/kda-hopper.md; the FP64 model of every stage is
// src/ref/kda_walk_model.hpp).
//
// Forward:  [qk_norm] -> kkt_solve<ChannelDecay> (G's last rows, the gated A, P, beta in fp32,
//           the walks' operands qg, kg, kbar) -> walk_a_fwd<ChannelDecay> (o, the final state;
//           in saved mode also h per chunk)
// Backward: the saved set from the forward (saved mode) or from its recompute [qk_norm] ->
//           kkt_solve<ChannelDecay> (in inverse mode, which kept G's last rows, A, beta and P:
//           the walks' operands alone) -> the h-walk; then walk_a_bwd<ChannelDecay> (dv, dh0, and
//           per chunk what the intra pass needs; split as GDN's where the walks do not fill the
//           device: its dS-walk beside the h-walk, then its chunk pass) -> intra_bwd (dg, dbeta;
//           dq, dk summed over the value heads, through the L2-norm backward from q̂, k̂ and
//           their rows' rstd, to bf16).
// The same kernels on the same inputs in every mode, so the modes agree bitwise.
#include "ops/kda_cuda.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/error.hpp"
#include "kernels/intra_bwd/launch.hpp"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "ops/cuda/kda_workspace.hpp"
#include "ops/cuda/stages.hpp"

namespace cake::ops {

namespace {

using kernels::ChannelDecay;
using kernels::Problem;
using namespace cuda;

// kkt_solve, the forward's per-chunk factors: G's last row, A, P, beta in fp32 and qg, kg, kbar per
// (chunk, value head); with products false qg, kg, kbar alone (the backward of inverse mode,
// which kept the rest).
void run_kkt_solve(Problem const& p, ForwardInputs const& in, bf16 const* q_used,
                    bf16 const* k_used, KdaBuffers const& b, bool products,
                    cudaStream_t stream) {
  kernels::kkt_solve::Params kp;
  kp.problem = p;
  kp.k = k_used;
  kp.q = q_used;
  kp.g = ptr<float const>(*in.g);
  kp.beta = in.beta->data;
  kp.beta_is_bf16 = in.beta->dtype == cakeBfloat16;
  kp.glast = products ? b.glast : nullptr;
  kp.beta_f32 = products ? b.beta_f32 : nullptr;
  kp.a = products ? b.a : nullptr;
  kp.aqk = products ? b.aqk : nullptr;
  kp.qg = b.qg;
  kp.kg = b.kg;
  kp.kbar = b.kbar;
  check_cuda(kernels::kkt_solve::launch<ChannelDecay>(kp, stream), "kkt_solve launch");
}

// The forward walk: o and ht when o is given (the forward), h per chunk when h is given (saved
// mode, or the backward's h-walk with o == nullptr).
void run_walk(Problem const& p, ForwardInputs const& in, KdaBuffers const& b, bf16* o, float* ht,
              bf16* h, int* walk_done, cudaStream_t stream) {
  kernels::walk_a_fwd::Params wp;
  wp.problem = p;
  wp.v = ptr<bf16 const>(*in.v);
  wp.a = b.a;
  wp.glast = b.glast;
  wp.beta = b.beta_f32;
  wp.h0 = ptr<float const>(*in.initial_state);
  wp.o = o;
  wp.ht = ht;
  wp.h = h;
  wp.walk_done = walk_done;
  wp.qg = b.qg;
  wp.kg = b.kg;
  wp.kbar = b.kbar;
  wp.aqk = o != nullptr ? b.aqk : nullptr;
  check_cuda(kernels::walk_a_fwd::launch<ChannelDecay>(wp, stream), "walk_a_fwd launch");
}

}  // namespace

size_t kda_cuda_saved_bytes(cakeOptions_t const& options, cakeTensor_t const& q,
                            cakeTensor_t const& v, cakeTensor_t const& cu_seqlens) {
  return saved_bytes_of(carve_kda_buffers, options, q, v, cu_seqlens);
}

size_t kda_cuda_forward_workspace_bytes(cakeOptions_t const& options,
                                        cakeForwardArgs_t const& args) {
  return forward_workspace_bytes_of(carve_kda_buffers, options, args);
}

void kda_cuda_forward(cakeOptions_t const& options, cakeForwardArgs_t const& args, void* saved,
                      void* workspace, size_t workspace_bytes, void* stream_ptr) {
  Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  check_aligned("q", args.q, 16);
  check_aligned("k", args.k, 16);
  check_aligned("v", args.v, 16);
  check_aligned("g", args.g, 16);
  check_aligned("o", args.o, 4);
  check_aligned("initial_state", args.initial_state, 8);
  check_aligned("final_state", args.final_state, 8);
  auto const b = bind_buffers(layout_for(carve_kda_buffers, ReverseForm::kWalk), options, p,
                              Pass::kForward, saved, workspace, workspace_bytes);
  if (empty(p)) return;
  auto const stream = static_cast<cudaStream_t>(stream_ptr);
  if (pass_states_without_tokens(p, args.initial_state, args.final_state, stream)) return;

  ForwardInputs const in{&args.q, &args.k, &args.v, &args.g, &args.beta, &args.initial_state};
  bf16 const* q_used = nullptr;
  bf16 const* k_used = nullptr;
  normalize_qk(p, options.use_qk_l2norm != 0, in, b, stream, &q_used, &k_used);
  run_kkt_solve(p, in, q_used, k_used, b, true, stream);
  run_walk(p, in, b, ptr<bf16>(args.o), ptr<float>(args.final_state),
           save_mode(options) == SaveMode::kSaved ? b.h : nullptr, nullptr, stream);
}

size_t kda_cuda_backward_workspace_bytes(cakeOptions_t const& options,
                                         cakeBackwardArgs_t const& args) {
  return backward_workspace_bytes_of(carve_kda_buffers, options, args);
}

void kda_cuda_backward(cakeOptions_t const& options, cakeBackwardArgs_t const& args,
                       void const* saved, void* workspace, size_t workspace_bytes,
                       void* stream_ptr) {
  Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  bool const l2 = options.use_qk_l2norm != 0;
  check_aligned("q", args.q, 16);
  check_aligned("k", args.k, 16);
  check_aligned("v", args.v, 16);
  check_aligned("g", args.g, 16);
  check_aligned("dout", args.dout, 16);
  check_aligned("dq", args.dq, 4);
  check_aligned("dk", args.dk, 4);
  check_aligned("dv", args.dv, 4);
  check_aligned("dht", args.dht, 8);
  check_aligned("dh0", args.dh0, 8);
  // In saved mode the backward passes the saved arena's regions to kernel inputs only.
  ReverseForm const form = reverse_form(p, args.dout.device_id);
  auto const b = bind_buffers(layout_for(carve_kda_buffers, form), options, p, Pass::kBackward,
                              const_cast<void*>(saved), workspace, workspace_bytes);
  if (empty(p)) return;
  auto const stream = static_cast<cudaStream_t>(stream_ptr);
  if (pass_states_without_tokens(p, args.dht, args.dh0, stream)) return;

  ForwardInputs const in{&args.q, &args.k, &args.v, &args.g, &args.beta, &args.initial_state};
  bf16 const* q_used = l2 ? b.q_norm : ptr<bf16 const>(args.q);
  bf16 const* k_used = l2 ? b.k_norm : ptr<bf16 const>(args.k);
  SaveMode const mode = save_mode(options);
  if (mode != SaveMode::kSaved) {  // the saved set, recomputed (inverse mode kept the products)
    normalize_qk(p, l2, in, b, stream, &q_used, &k_used);
    run_kkt_solve(p, in, q_used, k_used, b, mode == SaveMode::kRecompute, stream);
    clear_walk_flags(b.walk_done, p, stream);
    run_walk(p, in, b, nullptr, nullptr, b.h, b.walk_done, stream);
  }

  kernels::walk_a_bwd::Params wp;
  wp.problem = p;
  wp.q = b.qg;
  wp.k = b.kg;
  wp.v = ptr<bf16 const>(args.v);
  wp.dout = ptr<bf16 const>(args.dout);
  wp.a = b.a;
  wp.glast = b.glast;
  wp.beta = b.beta_f32;
  wp.h = b.h;
  wp.h_ready = b.walk_done;  // nullptr in saved mode
  wp.dht = ptr<float const>(args.dht);
  wp.dv = ptr<bf16>(args.dv);
  wp.dh0 = ptr<float>(args.dh0);
  wp.kbar = b.kbar;
  wp.aqk = b.aqk;
  wp.dqk = b.dqk;
  wp.dl = b.dl;
  wp.dqg = b.dqg;
  wp.dkg = b.dkg;
  wp.dkbar = b.dkbar;
  wp.dgamma = b.dgamma;
  wp.dbeta_walk = b.dbeta_walk;
  run_reverse_walk<ChannelDecay>(wp, form, b.ds_end, stream);

  kernels::intra_bwd::Params ip;
  ip.problem = p;
  ip.q = q_used;
  ip.k = k_used;
  ip.g = ptr<float const>(args.g);
  ip.beta = args.beta.data;
  ip.beta_is_bf16 = args.beta.dtype == cakeBfloat16;
  ip.dqk = b.dqk;
  ip.dl = b.dl;
  ip.dqg = b.dqg;
  ip.dkg = b.dkg;
  ip.dkbar = b.dkbar;
  ip.dgamma = b.dgamma;
  ip.dbeta_walk = b.dbeta_walk;
  ip.dq_sum = b.dq_sum;
  ip.dk_sum = b.dk_sum;
  ip.use_l2norm = l2;
  ip.q_rstd = b.q_rstd;  // with the norm (else nullptr, unread)
  ip.k_rstd = b.k_rstd;
  ip.dq = ptr<bf16>(args.dq);
  ip.dk = ptr<bf16>(args.dk);
  ip.dg = ptr<float>(args.dg);
  ip.dbeta = args.dbeta.data;
  ip.dbeta_is_bf16 = args.dbeta.dtype == cakeBfloat16;
  check_cuda(kernels::intra_bwd::launch(ip, stream), "intra_bwd launch");
}

}  // namespace cake::ops
