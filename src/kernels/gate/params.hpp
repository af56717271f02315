// Host <-> device contract of the in-op activations of g and beta (kernel.cuh says what they
// compute).
#pragma once

#include <cstdint>

#include "cake/cake.h"

namespace cake::kernels::gate {

// Tokens per tile of the backward's sums (one partial sum per tile and slot). A warp walks its
// tile kUnroll tokens at a time, one dependent batch of loads after another, and there are as
// many warps as tiles times groups of 32 slots. A short row (GDN's HV slots, at most 64) gets
// short tiles, so that the walks are short and many enough to fill the GPU (32,768 tokens at 8
// value heads: 512 tiles, 16 batches of loads a warp); a long row (KDA's HV K) has warps enough
// and keeps its partials small with long tiles.
constexpr int64_t tile_tokens(int64_t slots) { return slots <= 64 ? 64 : 256; }

constexpr int64_t num_tiles(int64_t num_tokens, int64_t slots) {
  return (num_tokens + tile_tokens(slots) - 1) / tile_tokens(slots);
}

// The backward's workspace of sums for rows of `slots` elements: [tiles, 2, slots], at least one
// tile (the reduction keeps its per-slot totals in tile 0's place).
constexpr int64_t partials_elements(int64_t num_tokens, int64_t slots) {
  int64_t const tiles = num_tiles(num_tokens, slots);
  return (tiles > 0 ? tiles : 1) * 2 * slots;
}

struct Params {
  int64_t num_tokens = 0;   // BT: B * T, all documents packed token-major
  int32_t num_v_heads = 0;  // HV
  int32_t width = 1;        // W: 1 (GDN, a gate per value head) or K (KDA, per key channel)

  // The gate: g [BT, HV, W] from the caller's g_raw, when activate_g.
  bool activate_g = false;
  void const* g_raw = nullptr;
  cakeDtype_t g_dtype = cakeFloat32;
  void const* A_log = nullptr;  // [HV], or nullptr: exp(A_log) = 1 (lower-bound form only)
  cakeDtype_t A_log_dtype = cakeFloat32;
  void const* dt_bias = nullptr;  // [HV W], or nullptr
  cakeDtype_t dt_bias_dtype = cakeFloat32;
  bool has_lower_bound = false;  // the lower-bound form, else the softplus form
  float lower_bound = 0.f;

  // beta [BT, HV] = beta_c sigmoid(beta_raw), when activate_beta.
  bool activate_beta = false;
  void const* beta_raw = nullptr;
  cakeDtype_t beta_dtype = cakeFloat32;
  float beta_c = 1.f;

  // Forward outputs, fp32 (what the delta rule's kernels read).
  float* g = nullptr;     // [BT, HV, W]
  float* beta = nullptr;  // [BT, HV]

  // Backward: the gradients of the activated g and beta (fp32, from the delta rule's backward)
  // in, the raw inputs' gradients out in their dtypes; each output nullptr when not wanted.
  float const* dg = nullptr;     // [BT, HV, W]
  void* dg_raw = nullptr;        // [BT, HV, W], g_dtype
  void* dA_log = nullptr;        // [HV], A_log_dtype
  void* ddt_bias = nullptr;      // [HV W], dt_bias_dtype
  float* partials = nullptr;     // partials_elements(BT, HV W) workspace, with dA_log or ddt_bias
  float const* dbeta = nullptr;  // [BT, HV]
  void* dbeta_raw = nullptr;     // [BT, HV], beta_dtype
};

}  // namespace cake::kernels::gate
