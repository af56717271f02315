// The causal depthwise conv1d of flash-linear-attention's causal_conv1d, in FP64: the ground
// truth of the conv op's tests and its CPU path.
//
// Per document n of L tokens and channel d, on the extended sequence e[j], j in [-W, L):
//   e[j] = x[j] for j >= 0; e[j] = h0[n, d, W + j] for j < 0 (0 without an initial state)
//   pre[t] = sum_{i < W} weight[d, i] e[t - (W - 1) + i] + bias[d]    (weight[d, W-1]: token t)
//   y[t]   = act(pre[t]) + residual[t]                  act: identity or silu(p) = p sigmoid(p)
//   ht[n, d, s] = e[L - W + s], s in [0, W)              (the last W tokens; for L < W the
//                                                         state's tail, shifted, fills the front)
// Documents never see each other's tokens. Column 0 of h0 enters the outputs only as ht of an
// empty document (the conv itself reads W - 1 tokens back).
#pragma once

#include <cstdint>
#include <vector>

namespace cake::ref {

enum class Activation { kNone, kSilu };

struct Conv1dShape {
  int64_t num_tokens = 0;           // T: all documents packed one after another
  int64_t dim = 0;                  // D: channels
  int64_t width = 0;                // W: taps
  std::vector<int64_t> cu_seqlens;  // [N + 1]: document n holds tokens [cu[n], cu[n+1])

  int64_t num_seqs() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
};

struct Conv1dInputs {
  double const* x = nullptr;         // [T, D]
  double const* weight = nullptr;    // [D, W]
  double const* bias = nullptr;      // [D], or nullptr
  double const* residual = nullptr;  // [T, D], or nullptr
  double const* h0 = nullptr;        // [N, D, W], or nullptr (zeros)
  Activation activation = Activation::kNone;
};

struct Conv1dOutputs {
  double* y = nullptr;   // [T, D]
  double* ht = nullptr;  // [N, D, W], or nullptr when not wanted
};

// Gradients of the inputs, each overwritten; a nullptr one is not computed.
struct Conv1dGrads {
  double* dx = nullptr;         // [T, D]
  double* dweight = nullptr;    // [D, W]
  double* dbias = nullptr;      // [D]
  double* dresidual = nullptr;  // [T, D]
  double* dh0 = nullptr;        // [N, D, W]
};

void conv1d_forward(Conv1dShape const& shape, Conv1dInputs const& in, Conv1dOutputs const& out);

// dy [T, D]; dht [N, D, W] or nullptr (zero).
void conv1d_backward(Conv1dShape const& shape, Conv1dInputs const& in, double const* dy,
                     double const* dht, Conv1dGrads const& grads);

}  // namespace cake::ref
