#include "plan/segments.hpp"

#include <algorithm>
#include <iterator>
#include <map>

#include "core/error.hpp"

namespace cake::plan {

std::vector<FragmentWork> fragment_work(RankShard const& shard) {
  std::vector<FragmentWork> table;
  for (Fragment const& f : shard.fragments) {
    table.push_back({(f.num_tokens() + kChunkSize - 1) / kChunkSize, f.state_out});
  }
  return table;
}

int64_t fragment_segments(int64_t num_chunks, int segments) {
  return std::max<int64_t>(1, std::min<int64_t>(segments, num_chunks));
}

std::vector<int64_t> segment_bounds(int64_t num_chunks, int segments) {
  int64_t const S = fragment_segments(num_chunks, segments);
  std::vector<int64_t> bounds{0};
  for (int64_t s = 0; s < S; ++s) {
    bounds.push_back(bounds.back() + num_chunks / S + (s < num_chunks % S ? 1 : 0));
  }
  return bounds;
}

int64_t lpt_makespan(std::vector<JobGroup> jobs, int64_t machines) {
  CAKE_CHECK(machines >= 1, cakeInvalidArgument, "machines must be >= 1, got ", machines);
  std::sort(jobs.begin(), jobs.end(),
            [](JobGroup const& a, JobGroup const& b) { return a.length > b.length; });
  // Machines grouped by load: load -> how many machines carry it. Machines of equal load are
  // interchangeable, so a group's identical jobs can be placed a whole level at a time.
  std::map<int64_t, int64_t> loads{{0, machines}};
  for (JobGroup const& group : jobs) {
    if (group.length <= 0) continue;
    int64_t left = group.count;
    while (left > 0) {
      auto const lowest = loads.begin();
      int64_t const load = lowest->first;
      int64_t const k = lowest->second;
      auto const above = std::next(lowest);
      // The k machines stay the least loaded (ties allowed) for `rounds` rounds of one job each.
      int64_t const rounds = above == loads.end()
                                 ? left / k
                                 : std::min(left / k, (above->first - load) / group.length + 1);
      if (rounds >= 1) {
        loads.erase(lowest);
        loads[load + rounds * group.length] += k;
        left -= rounds * k;
      } else {  // left < k: `left` of the k machines take one job each.
        lowest->second -= left;
        loads[load + group.length] += left;
        left = 0;
      }
    }
  }
  return loads.rbegin()->first;
}

WalkCost walk_cost(std::vector<FragmentWork> const& table, int64_t num_v_heads, int num_sms,
                   int segments) {
  std::vector<JobGroup> summary_jobs, tape_jobs;
  for (FragmentWork const& f : table) {
    if (f.num_chunks <= 0) continue;
    int64_t const S = fragment_segments(f.num_chunks, segments);
    int64_t const longer = f.num_chunks % S;  // segments holding one chunk more
    std::vector<JobGroup> const jobs = {{f.num_chunks / S + 1, longer * num_v_heads},
                                        {f.num_chunks / S, (S - longer) * num_v_heads}};
    tape_jobs.insert(tape_jobs.end(), jobs.begin(), jobs.end());
    if (S > 1 || f.state_out) summary_jobs.insert(summary_jobs.end(), jobs.begin(), jobs.end());
  }
  WalkCost cost;
  cost.summary_makespan = summary_jobs.empty() ? 0 : lpt_makespan(summary_jobs, num_sms);
  cost.tape_makespan = tape_jobs.empty() ? 0 : lpt_makespan(tape_jobs, num_sms);
  return cost;
}

int rank_segments(std::vector<FragmentWork> const& table, int64_t num_v_heads, int num_sms) {
  CAKE_CHECK(num_v_heads >= 1, cakeInvalidArgument, "num_v_heads must be >= 1, got ", num_v_heads);
  CAKE_CHECK(num_sms >= 1, cakeInvalidArgument, "num_sms must be >= 1, got ", num_sms);
  int64_t longest = 0;
  for (FragmentWork const& f : table) longest = std::max(longest, f.num_chunks);
  int const max_p = static_cast<int>(
      std::min<int64_t>(kMaxSegments, std::max<int64_t>(1, longest / kMinSegmentChunks)));
  std::vector<int64_t> costs;
  for (int p = 1; p <= max_p; ++p)
    costs.push_back(walk_cost(table, num_v_heads, num_sms, p).cost());
  int64_t const best = *std::min_element(costs.begin(), costs.end());
  for (int p = 1; p <= max_p; ++p) {
    if (costs[p - 1] * 100 <= best * (100 + kMarginPercent)) return p;
  }
  return 1;  // not reached: the best P itself qualifies
}

std::vector<int> plan_segments(std::vector<RankShard> const& shards, int64_t num_v_heads,
                               int num_sms, int segments) {
  CAKE_CHECK(segments == 0 || (segments >= 1 && segments <= kMaxSegments), cakeInvalidArgument,
             "segments must be 0 (the plan rule) or in [1, ", kMaxSegments, "], got ", segments);
  std::vector<int> plan;
  for (RankShard const& shard : shards) {
    plan.push_back(segments != 0 ? segments
                                 : rank_segments(fragment_work(shard), num_v_heads, num_sms));
  }
  return plan;
}

}  // namespace cake::plan
