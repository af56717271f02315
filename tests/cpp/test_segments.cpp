// The intra-rank segment plan (src/plan/segments.hpp): segment bounds, the LPT makespan against
// a job-by-job schedule, and the plan rule on worked examples whose P is derived by hand below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "plan/partition.hpp"
#include "plan/segments.hpp"

namespace {

using cake::plan::FragmentWork;
using cake::plan::JobGroup;
using cake::plan::Layout;

TEST(Segments, Bounds) {
  EXPECT_EQ(cake::plan::segment_bounds(10, 4), (std::vector<int64_t>{0, 3, 6, 8, 10}));
  EXPECT_EQ(cake::plan::segment_bounds(10, 1), (std::vector<int64_t>{0, 10}));
  EXPECT_EQ(cake::plan::segment_bounds(3, 8), (std::vector<int64_t>{0, 1, 2, 3}));  // S = 3
  EXPECT_EQ(cake::plan::fragment_segments(3, 8), 3);
  EXPECT_EQ(cake::plan::fragment_segments(300, 8), 8);
}

TEST(Segments, FragmentWork) {
  // Documents of 129 and 64 tokens (T = 193) over 2 contiguous ranks: 97 and 96 tokens.
  auto const shards = cake::plan::partition({0, 129, 129 + 64}, 2, Layout::kContiguous);
  // Rank 0 holds [0, 97): 97 tokens of document 0 = 2 chunks, crossing out.
  auto const work = cake::plan::fragment_work(shards[0]);
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].num_chunks, 2);
  EXPECT_TRUE(work[0].state_out);
  // Rank 1 holds [97, 129) of document 0 (1 chunk) and document 1 (64 tokens, 1 chunk).
  auto const last = cake::plan::fragment_work(shards[1]);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].num_chunks, 1);
  EXPECT_EQ(last[1].num_chunks, 1);
  EXPECT_FALSE(last[0].state_out);
}

// The classic LPT example: jobs 3, 3, 2, 2, 2 on 2 machines: LPT gives 3+2+2 = 7 (the optimum
// is 6); the model follows the list schedule, not the optimum.
TEST(Segments, LptMakespanExamples) {
  EXPECT_EQ(cake::plan::lpt_makespan({{2, 3}, {3, 2}}, 2), 7);
  EXPECT_EQ(cake::plan::lpt_makespan({{10, 3}}, 2), 20);
  EXPECT_EQ(cake::plan::lpt_makespan({{10, 3}}, 5), 10);
  EXPECT_EQ(cake::plan::lpt_makespan({}, 5), 0);
  EXPECT_THROW(cake::plan::lpt_makespan({{1, 1}}, 0), cake::Error);
}

// Job by job with a heap of machine loads: the definition the grouped version must match.
int64_t lpt_one_by_one(std::vector<JobGroup> jobs, int64_t machines) {
  std::vector<int64_t> lengths;
  for (JobGroup const& g : jobs) lengths.insert(lengths.end(), g.count, g.length);
  std::sort(lengths.rbegin(), lengths.rend());
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> loads;
  for (int64_t m = 0; m < machines; ++m) loads.push(0);
  for (int64_t length : lengths) {
    int64_t const lowest = loads.top();
    loads.pop();
    loads.push(lowest + length);
  }
  int64_t most = 0;
  while (!loads.empty()) {
    most = std::max(most, loads.top());
    loads.pop();
  }
  return most;
}

TEST(Segments, LptMakespanMatchesOneByOne) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<JobGroup> jobs(std::uniform_int_distribution<int>(1, 6)(rng));
    for (JobGroup& g : jobs) {
      g.length = std::uniform_int_distribution<int64_t>(1, 40)(rng);
      g.count = std::uniform_int_distribution<int64_t>(0, 60)(rng);
    }
    int64_t const machines = std::uniform_int_distribution<int64_t>(1, 20)(rng);
    ASSERT_EQ(cake::plan::lpt_makespan(jobs, machines), lpt_one_by_one(jobs, machines))
        << "trial " << trial;
  }
}

// ----- The rule on worked examples. cost(P) = 5 summary + 3 tape makespans (chunk steps); the
// rule takes the smallest P within 2 % of the least cost, P <= min(16, longest / 16).

// A. A rank inside one long document: one fragment of 1024 chunks crossing out, HV = 32 on 132
// SMs. At P <= 4 the 32 P walks fit on the SMs at once, makespan 1024 / P for both walks, so
// cost 8 * 1024 / P: P = 1 8192, P = 2 4096, P = 3 8 * 342 = 2736, P = 4 2048. Beyond, 32 P walks
// take several waves: P = 5: 128 walks of 205 and 32 of 204 -> 4 SMs take 204 + 204, the 128
// others 205, then 24 of them one more 204: makespan 409; P = 7: 64 walks of 147, 160 of 146 ->
// 293; P = 8: 256 walks of 128 -> 256; P = 11: 279; P = 12: 256; P = 16: 512 walks of 64 -> 4
// waves = 256. Nothing goes below 256 (8 * 256 = 2048), so P = 4, the smallest at 2048.
TEST(Segments, RuleLongCrossingFragment) {
  std::vector<FragmentWork> const table = {{1024, true}};
  EXPECT_EQ(cake::plan::walk_cost(table, 32, 132, 1).cost(), 8192);
  EXPECT_EQ(cake::plan::walk_cost(table, 32, 132, 3).cost(), 2736);
  EXPECT_EQ(cake::plan::walk_cost(table, 32, 132, 5).tape_makespan, 409);
  EXPECT_EQ(cake::plan::walk_cost(table, 32, 132, 7).tape_makespan, 293);
  EXPECT_EQ(cake::plan::walk_cost(table, 32, 132, 11).tape_makespan, 279);
  EXPECT_EQ(cake::plan::walk_cost(table, 32, 132, 16).tape_makespan, 256);
  EXPECT_EQ(cake::plan::rank_segments(table, 32, 132), 4);
}

// B. The same fragment with HV = 64: P = 2 gives 128 walks of 512 on 132 SMs, cost 8 * 512 =
// 4096; P = 3 gives 64 walks of 342 and 128 of 341: 64 SMs take 342, 68 take 341 + 341 -> 682.
// Every even P comes back to 512 (P = 4: 256 walks of 256 in two waves; P = 16: 1024 of 64 in 8),
// every odd P > 1 stays above it (P = 5: 256 walks of 205 and 64 of 204 -> 205 + 205 + 204 =
// 614; P = 15: 546), so nothing beats 4096 and P = 2, the smallest at 4096.
TEST(Segments, RuleLongCrossingFragmentMoreHeads) {
  std::vector<FragmentWork> const table = {{1024, true}};
  EXPECT_EQ(cake::plan::walk_cost(table, 64, 132, 2).cost(), 4096);
  EXPECT_EQ(cake::plan::walk_cost(table, 64, 132, 3).tape_makespan, 682);
  EXPECT_EQ(cake::plan::rank_segments(table, 64, 132), 2);
}

// C. A rank holding one whole long document (no crossing): P = 1 needs no summary walk, cost
// 3 * 1024 = 3072; P = 2 adds one (8 * 512 = 4096), P = 3 costs 8 * 342 = 2736, P = 4 2048 as in
// A. Splitting pays only once it more than halves the walk: P = 4.
TEST(Segments, RuleWholeLongDocument) {
  std::vector<FragmentWork> const table = {{1024, false}};
  EXPECT_EQ(cake::plan::walk_cost(table, 32, 132, 1).cost(), 3072);
  EXPECT_EQ(cake::plan::walk_cost(table, 32, 132, 2).cost(), 4096);
  EXPECT_EQ(cake::plan::rank_segments(table, 32, 132), 4);
}

// D. Two whole fragments of 600 chunks, HV = 64, 132 SMs: at P = 1 the 128 walks run in one wave,
// cost 3 * 600 = 1800. Any P > 1 adds the summary walk over the same work, and the work bound
// 128 * 600 / 132 > 581 makes it cost more than 8 * 581 > 1800: P = 1.
TEST(Segments, RuleOneWaveStaysWhole) {
  std::vector<FragmentWork> const table = {{600, false}, {600, false}};
  EXPECT_EQ(cake::plan::walk_cost(table, 64, 132, 1).cost(), 1800);
  EXPECT_EQ(cake::plan::rank_segments(table, 64, 132), 1);
}

// E. The P = 1 tie: two crossing fragments of 256 chunks, HV = 64, 128 SMs. P = 1: 128 walks
// in one wave, cost 8 * 256 = 2048; the work bound 128 * 256 / 128 = 256 holds at every P, so
// no P does better and the smallest, P = 1, wins (no composition, no backward re-walk).
TEST(Segments, RuleTieKeepsOneSegment) {
  std::vector<FragmentWork> const table = {{256, true}, {256, true}};
  EXPECT_EQ(cake::plan::walk_cost(table, 64, 128, 1).cost(), 2048);
  EXPECT_EQ(cake::plan::walk_cost(table, 64, 128, 2).cost(), 2048);
  EXPECT_EQ(cake::plan::rank_segments(table, 64, 128), 1);
}

// E2. The margin: one whole fragment of 131 chunks, HV = 48, 132 SMs, P <= 131 / 16 = 8.
//   P = 1: 48 walks of 131, no summary: 3 * 131 = 393.
//   P = 2: 48 walks of 66 and 48 of 65 fit at once: 8 * 66 = 528.
//   P = 3: 96 of 44, 48 of 43: 96 SMs at 44, 36 at 43, 12 of those take 43 more -> 86: 688.
//   P = 4: 144 of 33, 48 of 32: 132 at 33, 12 of them 66, 48 others 33 + 32 -> 66: 528.
//   P = 5: 48 of 27, 192 of 26: 48 at 27, 84 at 26 + 26 = 52, 24 take 27 + 26 -> 53: 424.
//   P = 6: 240 of 22, 48 of 21: 132 at 22, 108 at 44, 24 at 22 + 21 + 21 = 64: 512.
//   P = 7: 240 of 19, 96 of 18: 108 at 38, 24 at 19 + 18 + 18 = 55, 48 at 38 + 18 -> 56: 448.
//   P = 8: 144 of 17, 240 of 16: 12 at 34, 120 at 17 + 16 + 16 = 49: 392.
// P = 8 is the cheapest by one step, but 393 <= 1.02 * 392: P = 1, with no composition and no
// backward re-walk, which the model does not count.
TEST(Segments, RuleMarginPrefersFewerSegments) {
  std::vector<FragmentWork> const table = {{131, false}};
  std::vector<int64_t> const costs = {393, 528, 688, 528, 424, 512, 448, 392};
  for (int p = 1; p <= 8; ++p) {
    EXPECT_EQ(cake::plan::walk_cost(table, 48, 132, p).cost(), costs[p - 1]) << "P = " << p;
  }
  EXPECT_EQ(cake::plan::rank_segments(table, 48, 132), 1);
}

// F. Few heads, short fragment: 64 chunks crossing out, HV = 4. P is capped at 64 / 16 = 4
// (segments of at least 16 chunks); the 4 P walks always fit: cost 8 * 64 / P, so P = 4.
TEST(Segments, RuleCapsSegmentLength) {
  std::vector<FragmentWork> const table = {{64, true}};
  EXPECT_EQ(cake::plan::walk_cost(table, 4, 132, 4).cost(), 8 * 16);
  EXPECT_EQ(cake::plan::rank_segments(table, 4, 132), 4);
}

// G. Many short fragments (40 of 8 chunks): 8 / 16 < 1, so P = 1 without looking further.
TEST(Segments, RuleShortFragmentsStayWhole) {
  std::vector<FragmentWork> const table(40, FragmentWork{8, true});
  EXPECT_EQ(cake::plan::rank_segments(table, 16, 132), 1);
  EXPECT_EQ(cake::plan::rank_segments({}, 16, 132), 1);
}

// The whole plan: one document of 2048 chunks over 2 contiguous ranks is A on rank 0 and C on
// rank 1: [4, 4]. The override forces P everywhere and is checked against [1, 16].
TEST(Segments, PlanForEveryRank) {
  auto const shards = cake::plan::partition({0, 2048 * 64}, 2, Layout::kContiguous);
  EXPECT_EQ(cake::plan::plan_segments(shards, 32, 132), (std::vector<int>{4, 4}));
  EXPECT_EQ(cake::plan::plan_segments(shards, 32, 132, 3), (std::vector<int>{3, 3}));
  EXPECT_EQ(cake::plan::plan_segments(shards, 32, 132, 16), (std::vector<int>{16, 16}));
  auto const many = cake::plan::partition({0, 100, 200, 300, 400}, 2, Layout::kZigzagPerDocument);
  EXPECT_EQ(cake::plan::plan_segments(many, 32, 132), (std::vector<int>{1, 1}));
}

TEST(Segments, RejectsBadOverride) {
  auto const shards = cake::plan::partition({0, 4096}, 2, Layout::kContiguous);
  for (int bad : {-1, 17, 1000}) {
    try {
      cake::plan::plan_segments(shards, 32, 132, bad);
      ADD_FAILURE() << "segments = " << bad << " accepted";
    } catch (cake::Error const& e) {
      EXPECT_EQ(e.code(), cakeInvalidArgument);
      EXPECT_EQ(std::string(e.what()),
                "segments must be 0 (the plan rule) or in [1, 16], got " + std::to_string(bad));
    }
  }
  EXPECT_THROW(cake::plan::rank_segments({{64, true}}, 0, 132), cake::Error);
  EXPECT_THROW(cake::plan::rank_segments({{64, true}}, 8, 0), cake::Error);
}

}  // namespace
