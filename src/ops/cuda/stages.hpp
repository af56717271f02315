// What the GDN and KDA GPU paths (gdn_cuda.cpp, kda_cuda.cpp) share around their stages: the
// Problem of a validated call, the q/k L2 norm and the q/k gradients' reduction, and the checks
// of the caller's buffers against the layout's sizes (CUDA errors and alignment: checks.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cake/cake.h"
#include "core/error.hpp"
#include "kernels/common/problem.hpp"
#include "kernels/qk_grad/launch.hpp"
#include "kernels/qk_norm/launch.hpp"
#include "kernels/walk_a_bwd/launch.hpp"
#include "ops/cuda/carver.hpp"
#include "ops/cuda/checks.hpp"

namespace cake::ops::cuda {

using bf16 = __nv_bfloat16;

template <class T>
T* ptr(cakeTensor_t const& t) {
  return static_cast<T*>(t.data);
}

// Shapes of q [B, T, H, K], v [B, T, HV, V], cu_seqlens [N + 1] (seam-validated) -> Problem.
inline kernels::Problem make_problem(cakeOptions_t const& options, cakeTensor_t const& q,
                                     cakeTensor_t const& v, cakeTensor_t const& cu_seqlens) {
  CAKE_CHECK(q.shape[3] == kernels::kHeadDim && v.shape[3] == kernels::kHeadDim, cakeNotSupported,
             "the CUDA kernels are built for K = V = ", kernels::kHeadDim, ", got K = ", q.shape[3],
             ", V = ", v.shape[3]);
  kernels::Problem p;
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
  p.num_slots = kernels::slots_for(p.num_tokens, p.num_seqs);
  p.scale = static_cast<float>(options.scale);
  return p;
}

inline bool empty(kernels::Problem const& p) { return p.num_seqs == 0 || p.num_v_heads == 0; }

inline SaveMode save_mode(cakeOptions_t const& options) {  // validated: 0, 1 or 2
  return static_cast<SaveMode>(options.save_for_backward);
}

// The layout's sizes for a call (null bases: counting only); carve is the op's layout function
// (carve_gdn_buffers, carve_kda_buffers).
template <class Carve>
auto count_buffers(Carve const& carve, cakeOptions_t const& options, kernels::Problem const& p,
                   Pass pass) {
  return carve(p, options.use_qk_l2norm != 0, pass, save_mode(options), nullptr, nullptr);
}

// The caller's workspace holds the bytes the size query asked for (a null pointer holds none,
// whatever size comes with it: a null base would make every carved buffer null).
inline void check_workspace(void const* workspace, size_t needed, size_t got) {
  CAKE_CHECK(workspace != nullptr || got == 0, cakeInvalidArgument,
             "workspace is NULL but workspace_bytes = ", got);
  CAKE_CHECK(got >= needed, cakeInsufficientWorkspace, "workspace: expected at least ", needed,
             " bytes, got ", got);
}

// A call whose documents hold no token (T = 0, N >= 1): no stage runs (a TMA map of zero tokens
// cannot be encoded, and there is nothing to walk); each document's state passes unchanged, so
// `to` (final_state in the forward, dh0 in the backward) is `from` (initial_state, dht), or zeros
// without it. Returns whether the call had no token.
inline bool pass_states_without_tokens(kernels::Problem const& p, cakeTensor_t const& from,
                                       cakeTensor_t const& to, cudaStream_t stream) {
  if (p.num_tokens != 0) return false;
  if (to.data == nullptr) return true;
  size_t const bytes = sizeof(float) * static_cast<size_t>(p.num_seqs) * p.num_v_heads *
                       kernels::kHeadDim * kernels::kHeadDim;
  check_cuda(from.data != nullptr
                 ? cudaMemcpyAsync(to.data, from.data, bytes, cudaMemcpyDeviceToDevice, stream)
                 : cudaMemsetAsync(to.data, 0, bytes, stream),
             "the states of a call without tokens");
  return true;
}

// The buffers of one call, carved from the caller's saved buffer (its size checked by
// validate_saved against the same layout's count) and workspace, after checking the workspace
// holds the bytes that the size query (the same layout function) asked for and that a saved set
// that holds anything is aligned as the layout assumes.
template <class Carve>
auto bind_buffers(Carve const& carve, cakeOptions_t const& options, kernels::Problem const& p,
                  Pass pass, void* saved, void* workspace, size_t workspace_bytes) {
  auto const count = count_buffers(carve, options, p, pass);
  check_workspace(workspace, count.workspace_bytes, workspace_bytes);
  CAKE_CHECK(count.saved_bytes == 0 || reinterpret_cast<uintptr_t>(saved) % kSavedAlign == 0,
             cakeInvalidArgument, "saved must be ", kSavedAlign,
             "-byte aligned (the saved set's layout does not depend on its address), got address ",
             saved);
  return carve(p, options.use_qk_l2norm != 0, pass, save_mode(options), saved, workspace);
}

// The form of the backward's reverse walk (docs/design/gdn-hopper.md, "The split reverse walk"):
// kWalk, walk_a_bwd's one CTA per (document, value head) carrying dS, where the walks fill the
// device's SMs; kSplit where they do not: the dS-walk (the recurrence alone, beside the h-walk)
// stores dS per chunk, and the chunk pass forms the gradients one CTA per (chunk, value head).
// Both give the same gradients bitwise. Picked by the walks' count against the SM count of the
// tensors' device, which the workspace query and the call both ask (the split's dS buffer is in
// the workspace); where it cannot be asked, the walk: a CUDA build answers the size queries from
// shapes on a machine without a GPU too, and a call there fails at its first launch, which says
// why. The split's dS buffer (fp32 [num_slots, HV, K, V]: 64 KiB a chunk and value head, twice
// h) is held to kSplitDsBytes: past it the walk, slower where walks are few but with no such
// buffer (one 1M-token document at 16 value heads would need 16 GiB more).
enum class ReverseForm { kWalk, kSplit };
inline constexpr int64_t kSplitDsBytes = int64_t{8} << 30;
inline int64_t split_ds_bytes(kernels::Problem const& p) {
  return p.chunk_state_elements() * int64_t{sizeof(float)};
}
inline ReverseForm reverse_form(kernels::Problem const& p, int device) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();  // not left behind for a later launch's check to find
    return ReverseForm::kWalk;
  }
  bool const few_walks = int64_t{p.num_seqs} * p.num_v_heads < sms;
  return few_walks && split_ds_bytes(p) <= kSplitDsBytes ? ReverseForm::kSplit : ReverseForm::kWalk;
}

// The layout function of a call whose backward's reverse walk takes `form`: carve
// (carve_gdn_buffers, carve_kda_buffers) with its `split` bound, since only the split form's
// workspace holds ds_end (the forward's carve does not depend on it).
template <class Carve>
auto layout_for(Carve carve, ReverseForm form) {
  return [carve, split = form == ReverseForm::kSplit](kernels::Problem const& p,
                                                      bool use_qk_l2norm, Pass pass, SaveMode mode,
                                                      void* saved, void* workspace) {
    return carve(p, use_qk_l2norm, pass, mode, split, saved, workspace);
  };
}

// The op's size queries from its layout function (carve_gdn_buffers, carve_kda_buffers). The
// saved set and the forward's workspace do not depend on the reverse walk's form (the backward
// carves the saved set in the same order); the backward's workspace is that of the form the
// backward takes on the tensors' device.
template <class Carve>
size_t saved_bytes_of(Carve carve, cakeOptions_t const& options, cakeTensor_t const& q,
                      cakeTensor_t const& v, cakeTensor_t const& cu_seqlens) {
  return count_buffers(layout_for(carve, ReverseForm::kWalk), options,
                       make_problem(options, q, v, cu_seqlens), Pass::kForward)
      .saved_bytes;
}
template <class Carve>
size_t forward_workspace_bytes_of(Carve carve, cakeOptions_t const& options,
                                  cakeForwardArgs_t const& args) {
  return count_buffers(layout_for(carve, ReverseForm::kWalk), options,
                       make_problem(options, args.q, args.v, args.cu_seqlens), Pass::kForward)
      .workspace_bytes;
}
template <class Carve>
size_t backward_workspace_bytes_of(Carve carve, cakeOptions_t const& options,
                                   cakeBackwardArgs_t const& args) {
  kernels::Problem const p = make_problem(options, args.q, args.v, args.cu_seqlens);
  return count_buffers(layout_for(carve, reverse_form(p, args.dout.device_id)), options, p,
                       Pass::kBackward)
      .workspace_bytes;
}

// The backward's reverse walk in `form`. kSplit: the dS-walk first, into ds_end ([num_slots, HV,
// K, V] fp32), beside the h-walk (its programmatic dependent where the h-walk ran just before, so
// nothing is launched between them); it writes no dq or dk and takes no ticket, and it forms dh0.
// Then the chunk pass from its dS, each CTA on its walk's h flag.
template <class Decay>
void run_reverse_walk(kernels::walk_a_bwd::Params wp, ReverseForm form, float* ds_end,
                      cudaStream_t stream) {
  if (form == ReverseForm::kSplit) {
    check_cuda(kernels::walk_a_bwd::launch_ds_walk<Decay>(
                   kernels::walk_a_bwd::ds_walk_params(wp, ds_end), stream),
               "walk_a_bwd dS-walk launch");
    wp = kernels::walk_a_bwd::chunk_pass_params(wp, ds_end);
  }
  check_cuda(kernels::walk_a_bwd::launch<Decay>(wp, stream), "walk_a_bwd launch");
}

// The h-walk's flags ([N, HV] ints) cleared in stream order (capturable), before the h-walk that
// sets them and the reverse walks that wait on them.
inline void clear_walk_flags(int* walk_done, kernels::Problem const& p, cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(walk_done, 0,
                             sizeof(int) * static_cast<size_t>(p.num_seqs) * p.num_v_heads, stream),
             "walk flags memset");
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

// The q, k the later stages read: normalised copies (qk_norm, into b.q_norm and b.k_norm, each
// row's rstd into b.q_rstd and b.k_rstd for qk_grad's norm backward) with use_qk_l2norm, else the
// inputs. Buffers: GDN's or KDA's carve.
template <class Buffers>
void normalize_qk(kernels::Problem const& p, bool use_qk_l2norm, ForwardInputs const& in,
                  Buffers const& b, cudaStream_t stream, bf16 const** q_used,
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
  np.q_rstd = b.q_rstd;
  np.k_rstd = b.k_rstd;
  check_cuda(kernels::qk_norm::launch(np, stream), "qk_norm launch");
  *q_used = b.q_norm;
  *k_used = b.k_norm;
}

// dq and dk [T, H, K] from their terms dq_hv, dk_hv [T, H x group, K] (qk_grad): summed over
// each query head's `group` (1: summed already), and with use_qk_l2norm through the norm's
// backward from b.q_norm, b.k_norm and their rows' b.q_rstd, b.k_rstd (never from q or k).
template <class Buffers>
void reduce_qk_grads(kernels::Problem const& p, bool use_qk_l2norm, Buffers const& b,
                     cakeBackwardArgs_t const& args, float const* dq_hv, float const* dk_hv,
                     int group, cudaStream_t stream) {
  kernels::qk_grad::Params gp;
  gp.num_tokens = p.num_tokens;
  gp.num_qk_heads = p.num_qk_heads;
  gp.group_size = group;
  gp.use_l2norm = use_qk_l2norm;
  gp.q_norm = b.q_norm;  // with the norm (else nullptr, unread)
  gp.k_norm = b.k_norm;
  gp.q_rstd = b.q_rstd;
  gp.k_rstd = b.k_rstd;
  gp.dq_hv = dq_hv;
  gp.dk_hv = dk_hv;
  gp.dq = ptr<bf16>(args.dq);
  gp.dk = ptr<bf16>(args.dk);
  check_cuda(kernels::qk_grad::launch(gp, stream), "qk_grad launch");
}

}  // namespace cake::ops::cuda
