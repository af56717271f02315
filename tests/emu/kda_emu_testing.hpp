// What the emulated KDA kernel tests share: cases with a per-channel gate drawn as the KDA issue's
// adversarial cases ask (bounded, unbounded down to -20, g = 0 and -20 side by side in a token),
// beta near 0 and 1, documents around the 16-row sub-blocks' and the chunk's edges, GVA 1, 3, 4.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "emu/gdn_emu_testing.hpp"

namespace cake::kda_emu_testing {

using gdn_testing::Case;
using gdn_testing::K;

// How a case draws g [BT, HV, K] (natural-log decay per token and channel).
using GateDraw = std::function<double(std::mt19937&, int64_t channel)>;

struct KdaCase {
  Case shape;  // documents, heads, beta's range (its g range is not used)
  char const* gate_name;
  GateDraw gate;

  std::string label() const { return shape.name + ", g " + gate_name; }
};

inline double logsigmoid(double x) {
  return x < 0 ? x - std::log1p(std::exp(x)) : -std::log1p(std::exp(-x));
}

inline GateDraw uniform(double lo, double hi) {
  return [=](std::mt19937& rng, int64_t) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
}
// FLA's unbounded form: logsigmoid of N(0, 1), with one token and channel in 16 down to -20.
inline GateDraw unbounded() {
  return [](std::mt19937& rng, int64_t) {
    double const x = std::normal_distribution<double>(0.0, 1.0)(rng);
    bool const strong = std::uniform_int_distribution<int>(0, 15)(rng) == 0;
    return strong ? std::uniform_real_distribution<double>(-20.0, -10.0)(rng) : logsigmoid(x);
  };
}
// g = 0 on even channels and -20 on odd ones, in every token.
inline GateDraw split_channels() {
  return [](std::mt19937&, int64_t c) { return c % 2 == 0 ? 0.0 : -20.0; };
}

// U(-1, 0), but -20 on channel 97 one token in four: a 16-token block spans more than twice
// kTensorCoreReach on that channel alone when it holds four such tokens or more, so diagonal blocks
// of one chunk take the pairwise fallback or the tensor cores by one channel's vote (of the last
// 32-channel warp).
inline GateDraw one_channel_strong() {
  return [](std::mt19937& rng, int64_t c) {
    if (c == 97 && std::uniform_int_distribution<int>(0, 3)(rng) == 0) return -20.0;
    return std::uniform_real_distribution<double>(-1.0, 0.0)(rng);
  };
}

// g [BT, HV, K] of a problem of BT tokens and HV value heads, drawn by the case.
inline std::vector<double> draw_gate(KdaCase const& kc, int64_t BT, int HV, std::mt19937& rng) {
  std::vector<double> g(BT * HV * K);
  for (size_t i = 0; i < g.size(); ++i) g[i] = kc.gate(rng, static_cast<int64_t>(i % K));
  return g;
}

// The cases: documents of 1, 15, 16, 17, 63, 64, 65 and 130 tokens, GVA 1, 2 (two q/k heads), 3
// and 4, gates bounded, unbounded, at -20, at 0, 0 and -20 on alternate channels of every token,
// -20 on one channel of some tokens; beta near 0 and 1.
inline std::vector<KdaCase> cases() {
  return {
      {{"docs 1,15,16,17,63,64,65 GVA 1", {1, 15, 16, 17, 63, 64, 65}, 2, 2},
       "U(-1,0)",
       uniform(-1, 0)},
      {{"docs 65,130 GVA 3", {65, 130}, 1, 3}, "bounded U(-5,0)", uniform(-5, 0)},
      {{"docs 64,65 GVA 4", {64, 65}, 1, 4}, "logsigmoid, some to -20", unbounded()},
      {{"docs 65,70 H=2 GVA 2", {65, 70}, 2, 4}, "U(-1,0)", uniform(-1, 0)},
      {{"docs 17,130", {17, 130}, 1, 2}, "g=-20", uniform(-20, -20)},
      {{"docs 63,65", {63, 65}, 1, 2}, "g=0", uniform(0, 0)},
      {{"docs 130", {130}, 1, 2}, "g=0 and -20 by channel", split_channels()},
      {{"docs 64,130", {64, 130}, 1, 2}, "U(-1,0), -20 on one channel", one_channel_strong()},
      {{"docs 130 beta~0", {130}, 1, 2, -1.f, 0.f, 1e-4f, 2e-4f}, "U(-1,0)", uniform(-1, 0)},
      {{"docs 130 beta~1", {130}, 1, 2, -1.f, 0.f, 1.f - 2e-4f, 1.f - 1e-4f},
       "U(-0.1,0)",
       uniform(-0.1, 0)},
  };
}

}  // namespace cake::kda_emu_testing
