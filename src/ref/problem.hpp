// The FP64 reference's view of one GDN/KDA problem: shapes and dense token-major arrays.
//
// Everything here is FP64 and contiguous. The ops layer (src/ops) converts the caller's tensors
// (any float dtype, any strides) into these arrays, applies the optional in-kernel transforms
// (q/k L2 norm, gate activation, beta sigmoid; see preprocess.hpp) and calls a core below.
//
// Recurrence per document and value head hv (q/k head h = hv / (HV / H)), token t:
//   S_t = Decay_t S_{t-1} + k_t (beta_t (v_t - (Decay_t S_{t-1})^T k_t))^T,  o_t = scale S_t^T q_t
//   Decay_t = exp(g_t) (GDN, scalar) or Diag(exp(g_t)) (KDA, per key channel).
#pragma once

#include <cstdint>
#include <vector>

namespace cake::ref {

enum class Gate {
  kScalar,   // GDN: g [T, HV]
  kChannel,  // KDA: g [T, HV, K]
};

struct Shape {
  Gate gate = Gate::kScalar;
  int64_t num_tokens = 0;    // T: all documents packed one after another
  int64_t num_qk_heads = 0;  // H
  int64_t num_v_heads = 0;   // HV, a multiple of H
  int64_t head_dim_k = 0;    // K
  int64_t head_dim_v = 0;    // V
  std::vector<int64_t> cu_seqlens;  // [N + 1]: document n holds tokens [cu[n], cu[n+1])

  int64_t num_seqs() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
  int64_t group_size() const { return num_v_heads / num_qk_heads; }  // value heads per q/k head
  int64_t gate_width() const { return gate == Gate::kScalar ? 1 : head_dim_k; }
};

// Forward inputs. q, k, g, beta are the values the recurrence sees (already normalised/activated).
struct Inputs {
  const double* q = nullptr;     // [T, H, K]
  const double* k = nullptr;     // [T, H, K]
  const double* v = nullptr;     // [T, HV, V]
  const double* g = nullptr;     // [T, HV] or [T, HV, K]: natural-log decay per token
  const double* beta = nullptr;  // [T, HV]
  const double* h0 = nullptr;    // [N, HV, K, V], or nullptr for a zero initial state
  double scale = 1.0;
};

struct Outputs {
  double* o = nullptr;   // [T, HV, V]
  double* ht = nullptr;  // [N, HV, K, V] final state per document, or nullptr when not wanted
};

// Gradients arriving at the outputs.
struct OutputGrads {
  const double* d_o = nullptr;  // [T, HV, V]
  const double* dht = nullptr;  // [N, HV, K, V], or nullptr (zero)
};

// Gradients of the inputs, every one overwritten (not accumulated).
struct InputGrads {
  double* dq = nullptr;     // [T, H, K]  summed over the value heads that share the q/k head
  double* dk = nullptr;     // [T, H, K]
  double* dv = nullptr;     // [T, HV, V]
  double* dg = nullptr;     // [T, HV] or [T, HV, K]
  double* dbeta = nullptr;  // [T, HV]
  double* dh0 = nullptr;    // [N, HV, K, V], or nullptr when not wanted
};

}  // namespace cake::ref
