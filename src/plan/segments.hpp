// Intra-rank segments: a fragment of num_chunks 64-token chunks may be walked as P segments in
// parallel (each segment's summary from a zero state, a composition along the segments, then the
// re-walk of every segment from its true incoming state), so that one GPU has enough independent
// (segment, value head) walks when its rank holds few fragments and few heads.
//
// The plan rule picks one P per rank from the rank's fragment table, the value-head count and the
// SM count, with a longest-processing-time (LPT) makespan model of the walks (docs/design/
// context-parallel.md, "The segment plan"). It is a pure integer function of metadata, so every
// rank computes the same P for every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/partition.hpp"

namespace cake::plan {

inline constexpr int64_t kChunkSize = 64;
inline constexpr int kMaxSegments = 16;           // range of P, and of the segments= override
inline constexpr int64_t kMinSegmentChunks = 16;  // the rule splits a fragment no finer
inline constexpr int64_t kSummaryStepWeight = 5;  // cost of one summary-walk chunk step
inline constexpr int64_t kTapeStepWeight = 3;     // cost of one tape-walk chunk step
inline constexpr int64_t kMarginPercent = 2;      // the smallest P within this of the best wins

// One fragment as the plan sees it.
struct FragmentWork {
  int64_t num_chunks = 0;  // ceil(tokens / kChunkSize)
  bool state_out = false;  // its summary is exchanged even when walked in one segment
};

std::vector<FragmentWork> fragment_work(RankShard const& shard);

// Segments a fragment of num_chunks chunks is actually cut into at P: min(P, num_chunks).
int64_t fragment_segments(int64_t num_chunks, int segments);

// Chunk bounds of the fragment's segments: [S + 1] with S = fragment_segments(num_chunks, P);
// segment s holds chunks [b[s], b[s + 1]). Near-equal: the first num_chunks mod S hold one more.
std::vector<int64_t> segment_bounds(int64_t num_chunks, int segments);

// `count` independent jobs of `length` steps each.
struct JobGroup {
  int64_t length = 0;
  int64_t count = 0;
};

// Makespan of the longest-processing-time-first list schedule of the jobs on `machines`
// identical machines: jobs taken longest first, each onto the least-loaded machine.
int64_t lpt_makespan(std::vector<JobGroup> jobs, int64_t machines);

// The walk model of one rank at P segments, in chunk steps. One job is one (segment, value head)
// walk, one machine one SM.
//   summary jobs: every segment of every fragment that is cut (S > 1) or has state_out;
//   tape jobs:    every segment of every fragment.
// cost = kSummaryStepWeight * makespan(summary jobs) + kTapeStepWeight * makespan(tape jobs).
struct WalkCost {
  int64_t summary_makespan = 0;
  int64_t tape_makespan = 0;
  int64_t cost() const {
    return kSummaryStepWeight * summary_makespan + kTapeStepWeight * tape_makespan;
  }
};

WalkCost walk_cost(std::vector<FragmentWork> const& table, int64_t num_v_heads, int num_sms,
                   int segments);

// The rule for one rank: among P = 1 .. min(kMaxSegments, max(1, longest / kMinSegmentChunks)),
// the smallest P whose cost is within kMarginPercent of the least cost. P = 1 on an empty rank.
int rank_segments(std::vector<FragmentWork> const& table, int64_t num_v_heads, int num_sms);

// P for every rank: [W]. segments = 0 applies the rule; 1 <= segments <= kMaxSegments forces that
// P on every rank; anything else throws cake::Error(cakeInvalidArgument).
std::vector<int> plan_segments(std::vector<RankShard> const& shards, int64_t num_v_heads,
                               int num_sms, int segments = 0);

}  // namespace cake::plan
