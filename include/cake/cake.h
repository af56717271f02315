/* cake: chunked linear-attention training kernels (GDN and KDA).
 *
 * The public C ABI. Every entry point validates all of its arguments before doing any work and
 * returns a cakeResult_t; on failure cakeGetLastError() holds a message that names the argument,
 * the expected and the actual value. No entry point prints, exits or throws.
 *
 * Tensors are described by cakeTensor_t (a DLPack-like view). Layouts follow flash-linear-attention:
 *   q, k   [B, T, H, K]        v, o  [B, T, HV, V]        beta  [B, T, HV]
 *   g      GDN: [B, T, HV]     KDA: [B, T, HV, K]         (natural-log decay per token)
 *   initial_state, final_state   [N, HV, K, V]  (N = B, or the number of documents of cu_seqlens)
 *   cu_seqlens [N + 1] int32/int64: packed documents; requires B = 1. Its contents (start 0,
 *   non-decreasing, end T) are checked for CPU tensors; on the device they are not read by the
 *   host (that would synchronise), so invalid device offsets give undefined results.
 * Value head hv reads q/k head hv / (HV / H).
 * No output (or gradient) may share memory with an input or another output: the kernels read
 * while they write, so in-place calls are refused (cakeInvalidArgument) by every op's run.
 *
 * CPU tensors run the FP64 reference (any float dtype in, computed in FP64, written in the output
 * tensor's dtype). CUDA tensors run the GPU kernels where they exist, else cakeNotImplemented.
 * What each device accepts beyond the shared checks: cakeGetBuildInfo; whether one call would run
 * on a device: cakeCheckSupport.
 */
#ifndef CAKE_CAKE_H_
#define CAKE_CAKE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  cakeSuccess = 0,
  cakeInvalidArgument = 1,       /* a shape, dtype, device, layout or value is wrong */
  cakeNotSupported = 2,          /* valid, but outside what this build supports (e.g. head dim) */
  cakeInsufficientWorkspace = 3, /* the workspace or saved set is smaller than its size query */
  cakeCudaError = 4,             /* a CUDA call failed */
  cakeInternalError = 5,         /* a bug in cake */
  cakeNotImplemented = 6,        /* this device has no implementation of the call yet */
} cakeResult_t;

typedef enum {
  cakeFloat32 = 0,
  cakeFloat64 = 1,
  cakeBfloat16 = 2,
  cakeFloat16 = 3,
  cakeInt32 = 4,
  cakeInt64 = 5,
} cakeDtype_t;

typedef enum {
  cakeCPU = 1,  /* DLPack's kDLCPU */
  cakeCUDA = 2, /* DLPack's kDLCUDA */
} cakeDeviceType_t;

#define CAKE_MAX_DIMS 5

/* A strided view of a tensor. data == NULL marks an absent optional tensor. */
typedef struct {
  void* data;
  cakeDtype_t dtype;
  int32_t device_type; /* cakeDeviceType_t */
  int32_t device_id;
  int32_t ndim;
  int64_t shape[CAKE_MAX_DIMS];
  int64_t strides[CAKE_MAX_DIMS]; /* in elements, not bytes */
} cakeTensor_t;

typedef enum {
  cakeGdn = 0, /* gated delta rule: one decay per value head and token */
  cakeKda = 1, /* Kimi delta attention: one decay per value head, token and key channel */
} cakeVariant_t;

/* Options of one call; the forward and its backward must get the same options. */
typedef struct {
  size_t struct_size;      /* = sizeof(cakeOptions_t) */
  cakeVariant_t variant;
  double scale;            /* finite; callers pass K^-1/2 for the usual default */
  int32_t use_qk_l2norm;   /* q, k <- x / sqrt(sum x^2 + 1e-6) per token and head */
  int32_t use_gate_in_kernel; /* g <- -exp(A_log) softplus(g + dt_bias), or the lower-bound form */
  int32_t has_lower_bound; /* KDA with use_gate_in_kernel: g <- lower_bound sigmoid(...) */
  double lower_bound;
  int32_t use_beta_sigmoid; /* beta <- c sigmoid(beta), c = 2 with allow_neg_eigval, else 1 */
  int32_t allow_neg_eigval;
  /* The backward's source of the forward's intermediates (0, 1 or 2):
   *   0, recompute mode: cakeForward saves nothing (saved = NULL) and cakeBackward recomputes the
   *      forward's stages in its workspace; the least memory held between the two calls.
   *   1, saved mode: cakeForward also writes the "saved set" (cakeForwardSavedSize bytes) and
   *      cakeBackward reads it instead of recomputing those stages (a faster backward, more
   *      memory held; GDN on the H200 at a pack of 262,144 tokens and 48 value heads: forward +
   *      backward 38.5 ms against 44.7 in recompute mode, measured 2026-11-30).
   *   2, inverse mode: the saved set holds the chunk inverses and what comes with them (GDN on
   *      CUDA: A in bf16, the gate cumsum G and beta in fp32, and with use_qk_l2norm the
   *      normalised q, k in bf16 with each row's rstd in fp32; about what FLA keeps between its
   *      forward and backward), so cakeBackward recomputes the rest (the states per chunk) but
   *      not those.
   * All modes give bitwise identical results. The CPU reference always recomputes (its saved set
   * has 0 bytes) and accepts any mode. */
  int32_t save_for_backward;
  /* 0 (the default): every sum runs in a fixed order, so results are bitwise the same run to run.
   * 1: sums may run in whatever order the GPU reaches their terms, where that is faster (GDN on
   *    CUDA with grouped value heads: dq and dk summed over the value heads of each q/k head by
   *    atomic adds); results within the accuracy gate, not bitwise reproducible. The CPU
   *    reference and the other paths ignore it. */
  int32_t unordered_sums;
} cakeOptions_t;

typedef struct {
  cakeTensor_t q, k, v, g, beta;
  cakeTensor_t initial_state; /* optional, [N, HV, K, V] */
  cakeTensor_t cu_seqlens;    /* optional, [N + 1] */
  cakeTensor_t A_log;         /* [HV], with use_gate_in_kernel (optional with a lower bound) */
  cakeTensor_t dt_bias;       /* optional, GDN [HV], KDA [HV * K], with use_gate_in_kernel */
  cakeTensor_t o;             /* output [B, T, HV, V] */
  cakeTensor_t final_state;   /* optional output [N, HV, K, V] */
} cakeForwardArgs_t;

typedef struct {
  /* the forward's inputs, unchanged */
  cakeTensor_t q, k, v, g, beta, initial_state, cu_seqlens, A_log, dt_bias;
  /* gradients of the forward's outputs */
  cakeTensor_t dout;          /* [B, T, HV, V] */
  cakeTensor_t dht;           /* optional, [N, HV, K, V]: gradient of final_state */
  /* gradients of the inputs, overwritten; an absent one is not computed */
  cakeTensor_t dq, dk, dv, dg, dbeta;
  cakeTensor_t dh0;           /* optional, with initial_state */
  cakeTensor_t dA_log;        /* optional, with A_log */
  cakeTensor_t ddt_bias;      /* optional, with dt_bias */
} cakeBackwardArgs_t;

/* Size queries. They read shapes, dtypes and options, never tensor data, so any non-NULL data
 * pointers do; both depend on options.save_for_backward. On CUDA tensors the backward's also
 * depends on the SM count of dout's device: where the walks (documents x value heads) are fewer
 * than the SMs, the backward's reverse walk is split and its workspace holds each chunk's fp32
 * dS gradient ([chunks, HV, K, V], twice the bf16 h per chunk), so a size is valid for the
 * device it was asked on.
 * Workspace: the exact bytes of device scratch memory the call needs (0 on the CPU, which computes
 * in host memory of its own); its contents are dead once the call's work has run.
 * Saved: the exact bytes of the saved set that cakeForward writes and cakeBackward reads (0 in
 * recompute mode and on the CPU); cakeBackward checks its saved_bytes against the same size,
 * computed from its own arguments (same shapes, same options). */
cakeResult_t cakeForwardWorkspaceSize(const cakeOptions_t* options, const cakeForwardArgs_t* args,
                                      size_t* bytes);
cakeResult_t cakeBackwardWorkspaceSize(const cakeOptions_t* options,
                                       const cakeBackwardArgs_t* args, size_t* bytes);
cakeResult_t cakeForwardSavedSize(const cakeOptions_t* options, const cakeForwardArgs_t* args,
                                  size_t* bytes);

/* Forward: o (and final_state when given); in saved and inverse modes also the saved set. There,
 * saved holds at least the cakeForwardSavedSize bytes (NULL with saved_bytes = 0 when that is 0,
 * as on the CPU) and is 256-byte aligned (cudaMalloc's and torch's allocations are), so that the
 * saved set does not depend on its address and may be moved as a whole; in recompute mode saved is
 * NULL with saved_bytes = 0. The workspace holds at least the queried bytes (any address; NULL
 * only with workspace_bytes = 0). A saved set or workspace smaller than its query fails with
 * cakeInsufficientWorkspace. stream is a cudaStream_t for CUDA tensors and ignored for CPU
 * tensors. On CUDA the kernels' vector accesses need aligned bases, checked before any launch
 * (cakeNotSupported otherwise): q, k, v and dout 16 bytes (KDA's g too); the states
 * (initial_state, final_state, dht, dh0) 8 bytes; o, dq, dk, dv 4 bytes. The tensors' device is
 * made current for the call and the caller's restored after it. */
cakeResult_t cakeForward(const cakeOptions_t* options, const cakeForwardArgs_t* args, void* saved,
                         size_t saved_bytes, void* workspace, size_t workspace_bytes,
                         void* stream);

/* Backward: the gradients of every input given in args. In saved and inverse modes, saved is the
 * saved set its forward wrote with the same options and inputs (read only: one saved set serves
 * any number of backwards); in recompute mode NULL with saved_bytes = 0. For GDN on CUDA with
 * use_qk_l2norm in saved and inverse modes the saved set holds the normalised q and k, and
 * cakeBackward reads no element of args.q or args.k: only their shapes, dtypes and device are
 * checked, any strides, so a caller need not keep q and k (e.g. a one-element tensor expanded to
 * their shape stands in). KDA's backward checks q and k as its forward does, in every mode. */
cakeResult_t cakeBackward(const cakeOptions_t* options, const cakeBackwardArgs_t* args,
                          const void* saved, size_t saved_bytes, void* workspace,
                          size_t workspace_bytes, void* stream);

/* Whether the implementation for device_type (cakeCPU or cakeCUDA) would run this forward call and
 * its backward: the call's arguments are validated as usual, then checked against what that
 * device's implementation supports as if every tensor lived there (dtypes, head dims, options,
 * contiguity). cakeSuccess, or the failure cakeForward would return there (cakeNotImplemented
 * where that device has no implementation of the variant, or this build lacks it). Reads no
 * tensor data. */
cakeResult_t cakeCheckSupport(const cakeOptions_t* options, const cakeForwardArgs_t* args,
                              int32_t device_type);

/* ---- causal_conv1d: the causal depthwise convolution before the delta rule -------------------
 *
 * flash-linear-attention's causal_conv1d. Per document of L tokens and channel d, on the extended
 * sequence e[j] = x[j] (j >= 0), initial_state[n, d, W + j] (-W <= j < 0; 0 without one):
 *   y[t] = act(sum_{i < W} weight[d, i] e[t - (W - 1) + i] + bias[d]) + residual[t]
 *   final_state[n, d, s] = e[L - W + s]  (the last W tokens, the state's tail in front of a
 *                                          document shorter than W)
 * Layouts: x, residual, y [B, T, D]; weight [D, W]; bias [D]; states [N, D, W]; cu_seqlens as for
 * the delta rule (packed documents, B = 1). Documents never read each other's tokens.
 * CPU tensors run the FP64 reference (any float dtype, any W >= 1). CUDA tensors: see
 * cakeGetBuildInfo ("causal_conv1d"). */
typedef enum {
  cakeActivationNone = 0,
  cakeActivationSilu = 1,    /* silu (= swish): p sigmoid(p) */
  cakeActivationSigmoid = 2, /* sigmoid(p); the norm's gate only */
} cakeActivation_t;

typedef struct {
  size_t struct_size;         /* = sizeof(cakeConv1dForwardArgs_t) */
  int32_t activation;         /* cakeActivation_t */
  cakeTensor_t x;             /* [B, T, D] */
  cakeTensor_t weight;        /* [D, W] */
  cakeTensor_t bias;          /* optional, [D] */
  cakeTensor_t residual;      /* optional, [B, T, D], added after the activation */
  cakeTensor_t initial_state; /* optional, [N, D, W] */
  cakeTensor_t cu_seqlens;    /* optional, [N + 1] */
  cakeTensor_t y;             /* output [B, T, D] */
  cakeTensor_t final_state;   /* optional output [N, D, W] */
} cakeConv1dForwardArgs_t;

typedef struct {
  size_t struct_size; /* = sizeof(cakeConv1dBackwardArgs_t) */
  int32_t activation; /* the forward's */
  /* the forward's inputs, unchanged (the residual is not needed: its gradient is dy) */
  cakeTensor_t x, weight, bias, initial_state, cu_seqlens;
  cakeTensor_t dy;  /* [B, T, D] */
  cakeTensor_t dht; /* optional, [N, D, W]: gradient of final_state */
  /* gradients, overwritten; an absent one is not computed */
  cakeTensor_t dx;             /* [B, T, D] */
  cakeTensor_t dweight;        /* [D, W] */
  cakeTensor_t dbias;          /* [D], with bias */
  cakeTensor_t dresidual;      /* [B, T, D] (a copy of dy) */
  cakeTensor_t dinitial_state; /* [N, D, W], with initial_state */
} cakeConv1dBackwardArgs_t;

/* Exact bytes of device scratch memory of a call (0 on the CPU); read shapes and dtypes only. */
cakeResult_t cakeConv1dForwardWorkspaceSize(const cakeConv1dForwardArgs_t* args, size_t* bytes);
cakeResult_t cakeConv1dBackwardWorkspaceSize(const cakeConv1dBackwardArgs_t* args, size_t* bytes);

/* The workspace holds at least the queried bytes (else cakeInsufficientWorkspace) and, on CUDA,
 * is 16-byte aligned (else cakeInvalidArgument); stream is a cudaStream_t for CUDA tensors. On
 * CUDA: no host synchronisation (CUDA-graph capturable), and dweight and dbias are reduced in a
 * fixed order (bitwise reproducible). */
cakeResult_t cakeConv1dForward(const cakeConv1dForwardArgs_t* args, void* workspace,
                               size_t workspace_bytes, void* stream);
cakeResult_t cakeConv1dBackward(const cakeConv1dBackwardArgs_t* args, void* workspace,
                                size_t workspace_bytes, void* stream);

/* As cakeCheckSupport, for the conv: whether device_type's implementation would run this forward
 * and its backward. */
cakeResult_t cakeConv1dCheckSupport(const cakeConv1dForwardArgs_t* args, int32_t device_type);

/* ---- rms_norm_gated: the gated RMSNorm of the layers' outputs ---------------------------------
 *
 * flash-linear-attention's FusedRMSNormGated (and RMSNorm, without a gate) over the last dimension
 * of x [..., N], a row of N values at a time:
 *   rstd = 1 / sqrt(mean(x^2) + eps),   n = x rstd,   y = n weight act(g)
 * (weight absent: 1; g absent: no gate; act silu or sigmoid). Backward, with dn = dy weight act(g):
 *   dx = rstd (dn - n mean(dn n)),   dg = dy n weight act'(g),   dweight = sum_rows dy n act(g)
 * rstd [rows] (rows: the product of x's leading sizes) is written by the forward and read by the
 * backward. CPU tensors run the FP64 reference (any float dtype, any N, any strides of the
 * inputs). CUDA tensors: see cakeGetBuildInfo ("rms_norm_gated"). */
typedef struct {
  size_t struct_size;  /* = sizeof(cakeRmsNormForwardArgs_t) */
  int32_t activation;  /* with g: cakeActivationSilu or cakeActivationSigmoid; without: any */
  double eps;          /* finite, >= 0 */
  cakeTensor_t x;      /* [..., N], 1 to CAKE_MAX_DIMS dimensions */
  cakeTensor_t g;      /* optional, x's shape */
  cakeTensor_t weight; /* optional, [N] */
  cakeTensor_t y;      /* output, x's shape */
  cakeTensor_t rstd;   /* output, [rows] */
} cakeRmsNormForwardArgs_t;

typedef struct {
  size_t struct_size; /* = sizeof(cakeRmsNormBackwardArgs_t) */
  int32_t activation; /* the forward's */
  /* the forward's inputs, unchanged, and its rstd */
  cakeTensor_t x, g, weight, rstd;
  cakeTensor_t dy; /* x's shape */
  /* gradients, overwritten; an absent one is not computed */
  cakeTensor_t dx;      /* x's shape */
  cakeTensor_t dg;      /* x's shape, with g */
  cakeTensor_t dweight; /* [N], with weight */
} cakeRmsNormBackwardArgs_t;

/* Exact bytes of device scratch memory of a backward (0 on the CPU): on CUDA, per-block partial
 * sums of dweight. Reads shapes and dtypes only. The forward needs none. */
cakeResult_t cakeRmsNormBackwardWorkspaceSize(const cakeRmsNormBackwardArgs_t* args,
                                              size_t* bytes);

/* stream is a cudaStream_t for CUDA tensors. On CUDA: no host synchronisation (CUDA-graph
 * capturable); the backward's workspace holds at least the queried bytes (else
 * cakeInsufficientWorkspace) and is 16-byte aligned, and dweight is reduced in a fixed order
 * (bitwise reproducible); x, g, y, dy, dx and dg need 16-byte aligned bases (cakeNotSupported
 * otherwise). */
cakeResult_t cakeRmsNormForward(const cakeRmsNormForwardArgs_t* args, void* stream);
cakeResult_t cakeRmsNormBackward(const cakeRmsNormBackwardArgs_t* args, void* workspace,
                                 size_t workspace_bytes, void* stream);

/* As cakeCheckSupport, for the norm: whether device_type's implementation would run this forward
 * (its backward's rules are the same on the forward's tensors; a backward's own arguments are
 * checked by cakeRmsNormBackward). */
cakeResult_t cakeRmsNormCheckSupport(const cakeRmsNormForwardArgs_t* args, int32_t device_type);

/* How this library was built, as a JSON object: "cuda_kernels" (bool), "cuda_architectures"
 * (e.g. ["sm_90a"]), "cuda_runtime_version" (e.g. 13000, 0 without CUDA), "compiler", and "ops":
 * for each op ("chunk_gated_delta_rule", "chunk_kda", "causal_conv1d", "rms_norm_gated") and
 * device ("cpu", "cuda"; a device missing there has no implementation in this build) one line
 * saying what it accepts. Static storage. */
const char* cakeGetBuildInfo(void);

/* The name of a result code, e.g. "cakeInvalidArgument". */
const char* cakeGetErrorString(cakeResult_t result);

/* The message of this thread's last failed call ("" if none). Valid until the thread's next call. */
const char* cakeGetLastError(void);

#ifdef __cplusplus
}
#endif

#endif /* CAKE_CAKE_H_ */
