// Context-parallel partition: one packed batch of documents (global cu_seqlens, T tokens) split
// over W ranks, and the fragment table each rank needs to pass the recurrent state exactly.
//
// A rank's shard is a list of global token ranges; its local token order is the order of those
// ranges. Cutting the ranges at document boundaries gives the rank's fragments: the pieces of
// documents it holds, one local sequence each. A document cut into several fragments (pieces) is
// a chain: piece j's incoming state is the final state of piece j - 1, wherever that piece lives.
// docs/design/context-parallel.md explains the layouts, the summaries and the exchange.
//
// Pure host code: the same inputs give the same tables on every rank, so every rank can build all
// shards from the global cu_seqlens and no table is ever communicated.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace cake::plan {

enum class Layout {
  kContiguous,         // rank r holds part r of W near-equal parts of the whole batch
  kZigzag,             // rank r holds parts r and 2W-1-r of 2W near-equal parts of the whole batch
  kZigzagPerDocument,  // the zigzag split inside every document; remainders spread over the ranks
};

std::string_view layout_name(Layout layout);

// Tokens [begin, end) in some numbering (global or local).
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(TokenRange const&) const = default;
};

// Names one fragment: fragments[index] of shard `rank`. rank = -1 names none.
struct FragmentRef {
  int rank = -1;
  int index = -1;
  bool valid() const { return rank >= 0; }
  bool operator==(FragmentRef const&) const = default;
};

// One piece of one document held by one rank, walked as one local sequence.
struct Fragment {
  int64_t document = 0;    // n: the document's index in the global cu_seqlens
  int piece = 0;           // position in the document's chain, 0 = the piece holding its start
  int num_pieces = 1;      // fragments the document is cut into, over all ranks
  TokenRange global;       // inside [cu_seqlens[n], cu_seqlens[n + 1])
  TokenRange local;        // the same tokens in the rank's local numbering
  bool state_in = false;   // piece > 0: S_in is the final state of the previous piece
  bool state_out = false;  // piece < num_pieces - 1: the final state continues on the next piece
  FragmentRef previous;    // the piece before, valid iff state_in
  FragmentRef next;        // the piece after, valid iff state_out
  int summary_slot = -1;   // iff state_out: this fragment's record in its rank's forward exchange
  int adjoint_slot = -1;   // iff state_in: this fragment's record in its rank's backward exchange

  int64_t num_tokens() const { return global.size(); }
};

struct RankShard {
  int rank = 0;
  std::vector<TokenRange> global_ranges;  // in local order; globally adjacent neighbours merged
  std::vector<int64_t> cu_seqlens;        // [F + 1] local: fragment f holds [cu[f], cu[f + 1])
  std::vector<Fragment> fragments;        // [F] in local order
  int num_summaries = 0;                  // fragments with state_out (forward records)
  int num_adjoints = 0;                   // fragments with state_in (backward records)

  int64_t num_tokens() const { return cu_seqlens.back(); }
};

// The shards of the batch for every rank: [W]. Throws cake::Error(cakeInvalidArgument) unless
// world_size >= 1 and cu_seqlens is [N + 1], N >= 1, starting at 0, non-decreasing. Any T is
// accepted; a rank may hold zero tokens (cu_seqlens = {0}, no fragments). Empty documents get no
// fragment.
std::vector<RankShard> partition(std::vector<int64_t> const& cu_seqlens, int world_size,
                                 Layout layout);

// The global token ranges of every rank under `layout`, in local order: [W][ranges]. Parts are
// near-equal: of n tokens cut into p parts, n mod p parts hold one token more (which ones is
// described in docs/design/context-parallel.md). Empty ranges are left out.
std::vector<std::vector<TokenRange>> layout_ranges(std::vector<int64_t> const& cu_seqlens,
                                                   int world_size, Layout layout);

// The shards for explicit per-rank global token ranges (custom cut points): rank_ranges[r] lists
// rank r's ranges in its local order. The non-empty ranges must tile [0, T) exactly, else
// cake::Error(cakeInvalidArgument).
std::vector<RankShard> partition_ranges(std::vector<int64_t> const& cu_seqlens,
                                        std::vector<std::vector<TokenRange>> const& rank_ranges);

// Bytes of the summary exchange. Forward: every rank all-gathers one record per state_out
// fragment (its summary M, B for every value head: FP32 [HV, K, K + V], M in columns 0..K-1, B in
// K..K+V-1), padded to the same count on every rank since an all-gather moves equal sizes.
// Backward: the same with one adjoint record (M^T, dS_own) per state_in fragment. Every rank sends
// `slots * record_bytes` and receives that from each of the W - 1 others. Zero slots: no
// exchange is needed (every rank knows it, the tables being global).
struct SummaryExchange {
  int64_t record_bytes = 0;            // HV * K * (K + V) * 4
  int forward_slots = 0;               // max over ranks of num_summaries
  int backward_slots = 0;              // max over ranks of num_adjoints
  int64_t forward_send_bytes = 0;      // per rank: forward_slots * record_bytes
  int64_t forward_receive_bytes = 0;   // per rank: (W - 1) * forward_send_bytes
  int64_t backward_send_bytes = 0;     // per rank: backward_slots * record_bytes
  int64_t backward_receive_bytes = 0;  // per rank: (W - 1) * backward_send_bytes
};

SummaryExchange summary_exchange(std::vector<RankShard> const& shards, int64_t num_v_heads,
                                 int64_t head_dim_k, int64_t head_dim_v);

}  // namespace cake::plan
