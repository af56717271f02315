// The context-parallel partition (src/plan/partition.hpp): hand-worked shards, FLA's contiguous
// examples, and properties over random batches: the shards tile the batch, the fragment chains
// agree on both sides, the layouts cut where they say and keep ranks within one token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "plan/partition.hpp"

namespace {

using cake::plan::Fragment;
using cake::plan::FragmentRef;
using cake::plan::Layout;
using cake::plan::RankShard;
using cake::plan::TokenRange;

constexpr Layout kLayouts[] = {Layout::kContiguous, Layout::kZigzag, Layout::kZigzagPerDocument};

// Expects the shard's fragments to be exactly these: {document, global range, previous, next}.
struct Expected {
  int64_t document;
  TokenRange global;
  FragmentRef previous;
  FragmentRef next;
};

void expect_shard(RankShard const& shard, std::vector<int64_t> const& cu_seqlens,
                  std::vector<Expected> const& fragments) {
  SCOPED_TRACE("rank " + std::to_string(shard.rank));
  EXPECT_EQ(shard.cu_seqlens, cu_seqlens);
  ASSERT_EQ(shard.fragments.size(), fragments.size());
  for (size_t i = 0; i < fragments.size(); ++i) {
    SCOPED_TRACE("fragment " + std::to_string(i));
    Fragment const& f = shard.fragments[i];
    EXPECT_EQ(f.document, fragments[i].document);
    EXPECT_EQ(f.global, fragments[i].global);
    EXPECT_EQ(f.local, (TokenRange{cu_seqlens[i], cu_seqlens[i + 1]}));
    EXPECT_EQ(f.previous, fragments[i].previous);
    EXPECT_EQ(f.next, fragments[i].next);
    EXPECT_EQ(f.state_in, fragments[i].previous.valid());
    EXPECT_EQ(f.state_out, fragments[i].next.valid());
  }
}

FragmentRef const kNone{};

// Documents of lengths [5, 12, 3] (cu_seqlens [0, 5, 17, 20]) over W = 2; the same example is
// written out in docs/design/context-parallel.md.
std::vector<int64_t> const kExample = {0, 5, 17, 20};

// Contiguous: rank 0 holds [0, 10), rank 1 [10, 20). Document 1 = [5, 17) crosses.
TEST(Partition, ExampleContiguous) {
  auto const shards = cake::plan::partition(kExample, 2, Layout::kContiguous);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(shards[0].global_ranges, (std::vector<TokenRange>{{0, 10}}));
  EXPECT_EQ(shards[1].global_ranges, (std::vector<TokenRange>{{10, 20}}));
  expect_shard(shards[0], {0, 5, 10}, {{0, {0, 5}, kNone, kNone}, {1, {5, 10}, kNone, {1, 0}}});
  expect_shard(shards[1], {0, 7, 10}, {{1, {10, 17}, {0, 1}, kNone}, {2, {17, 20}, kNone, kNone}});
}

// Zigzag: 4 parts of 5 tokens; rank 0 holds parts 0 and 3 = [0, 5) and [15, 20), rank 1 parts 1
// and 2, adjacent, merged into [5, 15). Document 1 starts on rank 1 and ends on rank 0.
TEST(Partition, ExampleZigzag) {
  auto const shards = cake::plan::partition(kExample, 2, Layout::kZigzag);
  EXPECT_EQ(shards[0].global_ranges, (std::vector<TokenRange>{{0, 5}, {15, 20}}));
  EXPECT_EQ(shards[1].global_ranges, (std::vector<TokenRange>{{5, 15}}));
  expect_shard(
      shards[0], {0, 5, 7, 10},
      {{0, {0, 5}, kNone, kNone}, {1, {15, 17}, {1, 0}, kNone}, {2, {17, 20}, kNone, kNone}});
  expect_shard(shards[1], {0, 10}, {{1, {5, 15}, kNone, {0, 1}}});
}

// Per-document zigzag, 4 pieces per document, extra tokens to ranks in turn from a running rank:
//   document 0, 5 tokens:  5 = 4 * 1 + 1, the extra to rank 0's first piece: sizes [2, 1, 1, 1]
//     -> pieces [0,2) r0, [2,3) r1, [3,4) r1, [4,5) r0; next extra goes to rank 1.
//   document 1, 12 tokens: 12 = 4 * 3: [5,8) r0, [8,11) r1, [11,14) r1, [14,17) r0.
//   document 2, 3 tokens:  3 = 4 * 0 + 3, extras to rank 1 (first piece), rank 0 (first piece),
//     rank 1 (second piece): sizes [1, 1, 1, 0] -> [17,18) r0, [18,19) r1, [19,20) r1.
// Rank 1's two pieces of each document are adjacent and merge. Both ranks hold 10 tokens.
TEST(Partition, ExampleZigzagPerDocument) {
  auto const shards = cake::plan::partition(kExample, 2, Layout::kZigzagPerDocument);
  EXPECT_EQ(shards[0].global_ranges, (std::vector<TokenRange>{{0, 2}, {4, 8}, {14, 18}}));
  EXPECT_EQ(shards[1].global_ranges, (std::vector<TokenRange>{{2, 4}, {8, 14}, {18, 20}}));
  expect_shard(shards[0], {0, 2, 3, 6, 9, 10},
               {{0, {0, 2}, kNone, {1, 0}},
                {0, {4, 5}, {1, 0}, kNone},
                {1, {5, 8}, kNone, {1, 1}},
                {1, {14, 17}, {1, 1}, kNone},
                {2, {17, 18}, kNone, {1, 2}}});
  expect_shard(
      shards[1], {0, 2, 8, 10},
      {{0, {2, 4}, {0, 0}, {0, 1}}, {1, {8, 14}, {0, 2}, {0, 3}}, {2, {18, 20}, {0, 4}, kNone}});
  EXPECT_EQ(shards[0].num_summaries, 3);
  EXPECT_EQ(shards[0].num_adjoints, 2);
  EXPECT_EQ(shards[1].num_summaries, 2);
  EXPECT_EQ(shards[1].num_adjoints, 3);
  EXPECT_EQ(shards[0].fragments[2].summary_slot, 1);
  EXPECT_EQ(shards[1].fragments[2].adjoint_slot, 2);
}

// The contiguous layout reproduces FLA's own context-parallel examples, where T mod W = 0.
TEST(Partition, ContiguousMatchesFla) {
  auto const three = cake::plan::partition({0, 5, 12}, 3, Layout::kContiguous);
  EXPECT_EQ(three[1].cu_seqlens, (std::vector<int64_t>{0, 1, 4}));
  EXPECT_TRUE(three[1].fragments.front().state_in);
  EXPECT_TRUE(three[1].fragments.back().state_out);

  auto const four =
      cake::plan::partition({0, 257, 258, 511, 768, 769, 1022, 1024}, 4, Layout::kContiguous);
  EXPECT_EQ(four[0].cu_seqlens, (std::vector<int64_t>{0, 256}));
  EXPECT_EQ(four[1].cu_seqlens, (std::vector<int64_t>{0, 1, 2, 255, 256}));
  EXPECT_EQ(four[2].cu_seqlens, (std::vector<int64_t>{0, 256}));
  EXPECT_EQ(four[3].cu_seqlens, (std::vector<int64_t>{0, 1, 254, 256}));
  EXPECT_FALSE(four[3].fragments.front().state_in);  // document 3 ends exactly at rank 3's start
  EXPECT_EQ(four[2].fragments[0].previous, (FragmentRef{1, 3}));
}

// More ranks than tokens: the last ranks hold nothing.
TEST(Partition, RanksWithoutTokens) {
  for (Layout layout : kLayouts) {
    auto const shards = cake::plan::partition({0, 2, 3}, 8, layout);
    int64_t total = 0;
    for (RankShard const& shard : shards) total += shard.num_tokens();
    EXPECT_EQ(total, 3);
    EXPECT_EQ(shards[7].cu_seqlens, (std::vector<int64_t>{0}));
    EXPECT_TRUE(shards[7].fragments.empty());
  }
}

// ----- Properties over random batches.

std::vector<int64_t> random_cu_seqlens(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> num_docs(1, 12), kind(0, 9);
  std::vector<int64_t> cu{0};
  int const n = num_docs(rng);
  for (int i = 0; i < n; ++i) {
    int64_t length = 0;
    switch (kind(rng)) {
      case 0:
        length = 0;
        break;  // empty documents are allowed
      case 1:
      case 2:
        length = std::uniform_int_distribution<int64_t>(1, 4)(rng);
        break;
      case 3:
      case 4:
      case 5:
        length = std::uniform_int_distribution<int64_t>(1, 63)(rng);
        break;
      default:
        length = std::uniform_int_distribution<int64_t>(64, 700)(rng);
        break;
    }
    cu.push_back(cu.back() + length);
  }
  return cu;
}

// The owner rank of every global token and the checks every partition must pass.
std::vector<int> check_invariants(std::vector<int64_t> const& cu,
                                  std::vector<RankShard> const& shards, int W) {
  int64_t const T = cu.back();
  std::vector<int> owner(T, -1);
  EXPECT_EQ(static_cast<int>(shards.size()), W);
  for (int r = 0; r < W; ++r) {
    RankShard const& shard = shards[r];
    EXPECT_EQ(shard.rank, r);
    EXPECT_EQ(shard.cu_seqlens.size(), shard.fragments.size() + 1);
    EXPECT_EQ(shard.cu_seqlens[0], 0);
    // The fragments, in local order, are the global ranges cut at document boundaries.
    size_t range = 0;
    int64_t position = shard.global_ranges.empty() ? 0 : shard.global_ranges[0].begin;
    int summaries = 0, adjoints = 0;
    for (size_t i = 0; i < shard.fragments.size(); ++i) {
      Fragment const& f = shard.fragments[i];
      EXPECT_EQ(f.local, (TokenRange{shard.cu_seqlens[i], shard.cu_seqlens[i + 1]}));
      EXPECT_GT(f.num_tokens(), 0);
      EXPECT_EQ(f.local.size(), f.global.size());
      EXPECT_LE(cu[f.document], f.global.begin);
      EXPECT_LE(f.global.end, cu[f.document + 1]);
      if (position == shard.global_ranges[range].end) position = shard.global_ranges[++range].begin;
      EXPECT_EQ(f.global.begin, position);
      position = f.global.end;
      for (int64_t t = f.global.begin; t < f.global.end; ++t) {
        EXPECT_EQ(owner[t], -1) << "token " << t << " held twice";
        owner[t] = r;
      }
      EXPECT_EQ(f.summary_slot, f.state_out ? summaries++ : -1);
      EXPECT_EQ(f.adjoint_slot, f.state_in ? adjoints++ : -1);
    }
    EXPECT_EQ(shard.num_summaries, summaries);
    EXPECT_EQ(shard.num_adjoints, adjoints);
    if (!shard.fragments.empty()) {
      EXPECT_EQ(range + 1, shard.global_ranges.size());
      EXPECT_EQ(position, shard.global_ranges.back().end);
    }
    for (size_t i = 0; i + 1 < shard.global_ranges.size(); ++i) {
      EXPECT_NE(shard.global_ranges[i].end, shard.global_ranges[i + 1].begin) << "not merged";
    }
  }
  for (int64_t t = 0; t < T; ++t) EXPECT_NE(owner[t], -1) << "token " << t << " held by no rank";

  // Chains: every document's pieces follow each other without a gap, each side naming the other.
  auto at = [&](FragmentRef ref) -> Fragment const& {
    return shards[ref.rank].fragments[ref.index];
  };
  for (size_t n = 0; n + 1 < cu.size(); ++n) {
    if (cu[n] == cu[n + 1]) continue;
    int const r0 = owner[cu[n]];
    auto const first = std::find_if(shards[r0].fragments.begin(), shards[r0].fragments.end(),
                                    [&](Fragment const& f) { return f.global.begin == cu[n]; });
    EXPECT_NE(first, shards[r0].fragments.end());
    FragmentRef ref{r0, static_cast<int>(first - shards[r0].fragments.begin())};
    int64_t covered = cu[n];
    int pieces = 0;
    while (true) {
      Fragment const& f = at(ref);
      EXPECT_EQ(f.document, static_cast<int64_t>(n));
      EXPECT_EQ(f.global.begin, covered);
      EXPECT_EQ(f.piece, pieces);
      EXPECT_EQ(f.state_in, f.piece > 0);
      EXPECT_EQ(f.state_in, f.previous.valid());
      EXPECT_EQ(f.state_out, f.next.valid());
      covered = f.global.end;
      ++pieces;
      if (!f.state_out) break;
      EXPECT_EQ(at(f.next).previous, ref);
      ref = f.next;
    }
    EXPECT_EQ(covered, cu[n + 1]);
    EXPECT_EQ(at(ref).num_pieces, pieces);
  }
  return owner;
}

// The runs of equal owner along [begin, end): {rank, length} in order.
std::vector<std::pair<int, int64_t>> owner_runs(std::vector<int> const& owner, int64_t begin,
                                                int64_t end) {
  std::vector<std::pair<int, int64_t>> runs;
  for (int64_t t = begin; t < end; ++t) {
    if (runs.empty() || runs.back().first != owner[t]) runs.push_back({owner[t], 0});
    runs.back().second += 1;
  }
  return runs;
}

// The zigzag shape along [begin, end): ranks 0, 1, ..., W-1, W-1, ..., 0, pieces of
// length / 2W or one more, empty pieces left out, rank W-1's two pieces merged.
void expect_zigzag(std::vector<int> const& owner, int64_t begin, int64_t end, int W) {
  int64_t const base = (end - begin) / (2 * W);
  std::vector<int> order;
  for (int r = 0; r < W; ++r) order.push_back(r);
  for (int r = W - 1; r >= 0; --r) order.push_back(r);
  std::vector<int64_t> sizes(2 * W, 0);
  size_t piece = 0;
  for (auto const& [rank, length] : owner_runs(owner, begin, end)) {
    while (piece < order.size() && order[piece] != rank) ++piece;
    ASSERT_LT(piece, order.size()) << "rank " << rank << " out of zigzag order";
    if (rank == W - 1 && piece == static_cast<size_t>(W - 1)) {
      // Rank W-1's run is its two pieces merged: both are base or base + 1 iff its halves are.
      sizes[piece] = length - length / 2;
      sizes[piece + 1] = length / 2;
      piece += 2;
    } else {
      sizes[piece++] = length;
    }
  }
  for (int64_t s : sizes) {
    EXPECT_TRUE(s == base || s == base + 1) << "piece of " << s << ", base " << base;
  }
}

TEST(Partition, RandomBatchesTileAndChain) {
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int64_t> const cu = random_cu_seqlens(rng);
    int64_t const T = cu.back();
    for (int W : {1, 2, 3, 4, 8}) {
      for (Layout layout : kLayouts) {
        SCOPED_TRACE("trial " + std::to_string(trial) + " W " + std::to_string(W) + " " +
                     std::string(cake::plan::layout_name(layout)));
        auto const shards = cake::plan::partition(cu, W, layout);
        std::vector<int> const owner = check_invariants(cu, shards, W);
        if (::testing::Test::HasFailure()) return;

        // Every layout keeps the ranks' token counts within one of each other.
        int64_t most = 0, least = T;
        for (RankShard const& shard : shards) {
          most = std::max(most, shard.num_tokens());
          least = std::min(least, shard.num_tokens());
        }
        EXPECT_LE(most - least, 1);

        switch (layout) {
          case Layout::kContiguous:
            for (int r = 0; r < W; ++r) {
              EXPECT_LE(shards[r].global_ranges.size(), 1u);
              EXPECT_EQ(shards[r].num_tokens(), T / W + (r < T % W ? 1 : 0));
            }
            EXPECT_TRUE(std::is_sorted(owner.begin(), owner.end()));
            break;
          case Layout::kZigzag:
            for (int r = 0; r < W; ++r) EXPECT_LE(shards[r].global_ranges.size(), 2u);
            expect_zigzag(owner, 0, T, W);
            break;
          case Layout::kZigzagPerDocument:
            for (size_t n = 0; n + 1 < cu.size(); ++n) expect_zigzag(owner, cu[n], cu[n + 1], W);
            break;
        }
      }
    }
  }
}

// Custom cut points: random pieces dealt to random ranks in a random local order.
TEST(Partition, RandomRangesTileAndChain) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> const cu = random_cu_seqlens(rng);
    int64_t const T = cu.back();
    int const W = std::uniform_int_distribution<int>(1, 5)(rng);
    std::vector<std::vector<TokenRange>> ranges(W);
    for (int64_t begin = 0; begin < T;) {
      int64_t const end = std::min(T, begin + std::uniform_int_distribution<int64_t>(1, 90)(rng));
      ranges[std::uniform_int_distribution<int>(0, W - 1)(rng)].push_back({begin, end});
      begin = end;
    }
    for (auto& list : ranges) std::shuffle(list.begin(), list.end(), rng);
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_invariants(cu, cake::plan::partition_ranges(cu, ranges), W);
    if (::testing::Test::HasFailure()) return;
  }
}

// ----- Invalid input.

// Runs f, expects cake::Error(cakeInvalidArgument) whose message holds every one of `words`.
template <class F>
void expect_invalid(F const& f, std::vector<std::string> const& words) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (cake::Error const& e) {
    EXPECT_EQ(e.code(), cakeInvalidArgument);
    for (auto const& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(Partition, RejectsBadInput) {
  using cake::plan::partition;
  expect_invalid([] { partition({0, 4}, 0, Layout::kContiguous); }, {"world_size", ">= 1", "0"});
  expect_invalid([] { partition({}, 2, Layout::kZigzag); }, {"cu_seqlens", "N + 1 >= 2", "0"});
  expect_invalid([] { partition({0}, 2, Layout::kZigzag); }, {"cu_seqlens", "got 1"});
  expect_invalid([] { partition({3, 5}, 2, Layout::kZigzag); }, {"cu_seqlens[0]", "got 3"});
  expect_invalid(
      [] {
        partition({0, 5, 3}, 2, Layout::kZigzagPerDocument);
      },
      {"non-decreasing", "cu_seqlens[2] = 3", "cu_seqlens[1] = 5"});
  using cake::plan::partition_ranges;
  expect_invalid([] { partition_ranges({0, 10}, {}); }, {"rank_ranges", "W >= 1"});
  expect_invalid(
      [] {
        partition_ranges({0, 10}, {{{0, 6}}, {{5, 10}}});
      },
      {"tile [0, 10)", "token 5", "two ranges"});
  expect_invalid(
      [] {
        partition_ranges({0, 10}, {{{0, 4}}, {{5, 10}}});
      },
      {"tile [0, 10)", "[4, 5)", "no range"});
  expect_invalid([] { partition_ranges({0, 10}, {{{0, 4}}, {{4, 8}}}); }, {"[8, 10)", "no range"});
  expect_invalid(
      [] {
        partition_ranges({0, 10}, {{{0, 4}}, {{4, 12}}});
      },
      {"rank_ranges[1][0] = [4, 12)", "T = 10"});
}

// ----- The summary exchange.

TEST(Partition, SummaryExchangeBytes) {
  // The per-document example: rank 0 sends 3 summaries and rank 1 two, so 3 slots forward;
  // backward rank 1 has 3 state_in fragments. One record: HV K (K + V) FP32 = 4 8 24 4 bytes.
  auto const shards = cake::plan::partition(kExample, 2, Layout::kZigzagPerDocument);
  auto const x = cake::plan::summary_exchange(shards, 4, 8, 16);
  EXPECT_EQ(x.record_bytes, 3072);
  EXPECT_EQ(x.forward_slots, 3);
  EXPECT_EQ(x.backward_slots, 3);
  EXPECT_EQ(x.forward_send_bytes, 3 * 3072);
  EXPECT_EQ(x.forward_receive_bytes, 3 * 3072);
  EXPECT_EQ(x.backward_send_bytes, 3 * 3072);

  // One document over 4 contiguous ranks: one summary on ranks 0-2, one adjoint on ranks 1-3;
  // FLA's figure of HV K (K + V) 4 bytes per rank: 4 MiB for HV = 32, K = V = 128.
  auto const chain = cake::plan::partition({0, 4096}, 4, Layout::kContiguous);
  auto const y = cake::plan::summary_exchange(chain, 32, 128, 128);
  EXPECT_EQ(y.forward_send_bytes, 4 << 20);
  EXPECT_EQ(y.forward_receive_bytes, 3 * (4 << 20));
  EXPECT_EQ(y.backward_slots, 1);

  // Whole documents on every rank: nothing to exchange.
  auto const whole = cake::plan::partition({0, 8, 16}, 2, Layout::kContiguous);
  EXPECT_EQ(cake::plan::summary_exchange(whole, 32, 128, 128).forward_send_bytes, 0);
  expect_invalid([&] { cake::plan::summary_exchange(whole, 0, 128, 128); }, {"num_v_heads"});
}

}  // namespace
