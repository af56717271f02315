#include "plan/partition.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"

namespace cake::plan {

namespace {

void check_cu_seqlens(std::vector<int64_t> const& cu_seqlens) {
  CAKE_CHECK(cu_seqlens.size() >= 2, cakeInvalidArgument,
             "cu_seqlens must have N + 1 >= 2 entries, got ", cu_seqlens.size());
  CAKE_CHECK(cu_seqlens[0] == 0, cakeInvalidArgument, "cu_seqlens[0] must be 0, got ",
             cu_seqlens[0]);
  for (size_t n = 1; n < cu_seqlens.size(); ++n) {
    CAKE_CHECK(cu_seqlens[n] >= cu_seqlens[n - 1], cakeInvalidArgument,
               "cu_seqlens must be non-decreasing, got cu_seqlens[", n, "] = ", cu_seqlens[n],
               " < cu_seqlens[", n - 1, "] = ", cu_seqlens[n - 1]);
  }
}

void check_world_size(int world_size) {
  CAKE_CHECK(world_size >= 1, cakeInvalidArgument, "world_size must be >= 1, got ", world_size);
}

// Appends r to a rank's ranges, dropping it when empty and merging it into the last range when
// the two are globally adjacent (the state then simply continues within the rank).
void append_range(std::vector<TokenRange>& ranges, TokenRange r) {
  if (r.size() == 0) return;
  if (!ranges.empty() && ranges.back().end == r.begin) {
    ranges.back().end = r.end;
  } else {
    ranges.push_back(r);
  }
}

// Sizes of the 2W zigzag pieces of `length` tokens: rank r owns pieces r and 2W-1-r. Each piece
// holds length / 2W tokens; the length mod 2W extra tokens go to ranks in turn, starting at rank
// `first_rank`: one extra on each rank's first piece, then (when more than W are left) on its
// second piece. Over a batch, rotating first_rank keeps the ranks' totals within one token.
std::vector<int64_t> zigzag_piece_sizes(int64_t length, int world_size, int64_t first_rank) {
  int64_t const num_pieces = 2 * static_cast<int64_t>(world_size);
  std::vector<int64_t> sizes(num_pieces, length / num_pieces);
  int64_t const extra = length % num_pieces;
  for (int64_t j = 0; j < extra; ++j) {
    int64_t const rank = (first_rank + j) % world_size;
    sizes[j < world_size ? rank : num_pieces - 1 - rank] += 1;
  }
  return sizes;
}

std::vector<int64_t> prefix_sums(std::vector<int64_t> const& sizes, int64_t start) {
  std::vector<int64_t> bounds{start};
  for (int64_t s : sizes) bounds.push_back(bounds.back() + s);
  return bounds;
}

}  // namespace

std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kZigzag:
      return "zigzag";
    case Layout::kZigzagPerDocument:
      return "zigzag_per_document";
  }
  return "unknown";
}

std::vector<std::vector<TokenRange>> layout_ranges(std::vector<int64_t> const& cu_seqlens,
                                                   int world_size, Layout layout) {
  check_cu_seqlens(cu_seqlens);
  check_world_size(world_size);
  int64_t const T = cu_seqlens.back();
  int const W = world_size;
  std::vector<std::vector<TokenRange>> ranges(W);
  switch (layout) {
    case Layout::kContiguous: {
      // W parts; the first T mod W parts hold one token more.
      std::vector<int64_t> sizes(W, T / W);
      for (int64_t r = 0; r < T % W; ++r) sizes[r] += 1;
      std::vector<int64_t> const b = prefix_sums(sizes, 0);
      for (int r = 0; r < W; ++r) append_range(ranges[r], {b[r], b[r + 1]});
      break;
    }
    case Layout::kZigzag: {
      std::vector<int64_t> const b = prefix_sums(zigzag_piece_sizes(T, W, 0), 0);
      for (int r = 0; r < W; ++r) {
        append_range(ranges[r], {b[r], b[r + 1]});
        append_range(ranges[r], {b[2 * W - 1 - r], b[2 * W - r]});
      }
      break;
    }
    case Layout::kZigzagPerDocument: {
      // Rank r's ranges go document by document, so its local order is the global order.
      int64_t first_rank = 0;
      for (size_t n = 0; n + 1 < cu_seqlens.size(); ++n) {
        int64_t const length = cu_seqlens[n + 1] - cu_seqlens[n];
        std::vector<int64_t> const b =
            prefix_sums(zigzag_piece_sizes(length, W, first_rank), cu_seqlens[n]);
        for (int r = 0; r < W; ++r) {
          append_range(ranges[r], {b[r], b[r + 1]});
          append_range(ranges[r], {b[2 * W - 1 - r], b[2 * W - r]});
        }
        first_rank = (first_rank + length % (2 * W)) % W;
      }
      break;
    }
  }
  return ranges;
}

std::vector<RankShard> partition(std::vector<int64_t> const& cu_seqlens, int world_size,
                                 Layout layout) {
  return partition_ranges(cu_seqlens, layout_ranges(cu_seqlens, world_size, layout));
}

std::vector<RankShard> partition_ranges(std::vector<int64_t> const& cu_seqlens,
                                        std::vector<std::vector<TokenRange>> const& rank_ranges) {
  check_cu_seqlens(cu_seqlens);
  CAKE_CHECK(!rank_ranges.empty(), cakeInvalidArgument,
             "rank_ranges must list W >= 1 ranks, got 0");
  int64_t const T = cu_seqlens.back();
  int const W = static_cast<int>(rank_ranges.size());

  // Validate each range, then check that the non-empty ones tile [0, T) exactly.
  std::vector<TokenRange> all;
  for (int r = 0; r < W; ++r) {
    for (size_t i = 0; i < rank_ranges[r].size(); ++i) {
      TokenRange const x = rank_ranges[r][i];
      CAKE_CHECK(0 <= x.begin && x.begin <= x.end && x.end <= T, cakeInvalidArgument,
                 "rank_ranges[", r, "][", i, "] = [", x.begin, ", ", x.end,
                 ") must satisfy 0 <= begin <= end <= T = ", T);
      if (x.size() > 0) all.push_back(x);
    }
  }
  std::sort(all.begin(), all.end(),
            [](TokenRange const& a, TokenRange const& b) { return a.begin < b.begin; });
  int64_t covered = 0;
  for (TokenRange const& x : all) {
    CAKE_CHECK(x.begin >= covered, cakeInvalidArgument, "rank_ranges must tile [0, ", T,
               ") exactly, but token ", x.begin, " is held by two ranges");
    CAKE_CHECK(x.begin == covered, cakeInvalidArgument, "rank_ranges must tile [0, ", T,
               ") exactly, but tokens [", covered, ", ", x.begin, ") are held by no range");
    covered = x.end;
  }
  CAKE_CHECK(covered == T, cakeInvalidArgument, "rank_ranges must tile [0, ", T,
             ") exactly, but tokens [", covered, ", ", T, ") are held by no range");

  // Cut every rank's ranges at document boundaries: one fragment per (range, document) overlap.
  std::vector<RankShard> shards(W);
  for (int r = 0; r < W; ++r) {
    RankShard& shard = shards[r];
    shard.rank = r;
    for (TokenRange const& x : rank_ranges[r]) append_range(shard.global_ranges, x);
    shard.cu_seqlens = {0};
    for (TokenRange const& x : shard.global_ranges) {
      int64_t begin = x.begin;
      while (begin < x.end) {
        // The document holding token `begin`: the last n with cu[n] <= begin (skips empty ones).
        auto const it = std::upper_bound(cu_seqlens.begin(), cu_seqlens.end(), begin);
        int64_t const n = (it - cu_seqlens.begin()) - 1;
        int64_t const end = std::min(x.end, cu_seqlens[n + 1]);
        Fragment f;
        f.document = n;
        f.global = {begin, end};
        int64_t const local_begin = shard.cu_seqlens.back();
        f.local = {local_begin, local_begin + (end - begin)};
        shard.fragments.push_back(f);
        shard.cu_seqlens.push_back(f.local.end);
        begin = end;
      }
    }
  }

  // Chain the pieces of every document in global order.
  int64_t const N = static_cast<int64_t>(cu_seqlens.size()) - 1;
  std::vector<std::vector<FragmentRef>> chains(N);
  for (int r = 0; r < W; ++r) {
    for (size_t i = 0; i < shards[r].fragments.size(); ++i) {
      chains[shards[r].fragments[i].document].push_back({r, static_cast<int>(i)});
    }
  }
  auto fragment = [&](FragmentRef ref) -> Fragment& {
    return shards[ref.rank].fragments[ref.index];
  };
  for (auto& chain : chains) {
    std::sort(chain.begin(), chain.end(), [&](FragmentRef a, FragmentRef b) {
      return fragment(a).global.begin < fragment(b).global.begin;
    });
    int const num_pieces = static_cast<int>(chain.size());
    for (int j = 0; j < num_pieces; ++j) {
      Fragment& f = fragment(chain[j]);
      f.piece = j;
      f.num_pieces = num_pieces;
      f.state_in = j > 0;
      f.state_out = j + 1 < num_pieces;
      if (f.state_in) f.previous = chain[j - 1];
      if (f.state_out) f.next = chain[j + 1];
    }
  }

  // Exchange records in local order.
  for (RankShard& shard : shards) {
    for (Fragment& f : shard.fragments) {
      if (f.state_out) f.summary_slot = shard.num_summaries++;
      if (f.state_in) f.adjoint_slot = shard.num_adjoints++;
    }
  }
  return shards;
}

SummaryExchange summary_exchange(std::vector<RankShard> const& shards, int64_t num_v_heads,
                                 int64_t head_dim_k, int64_t head_dim_v) {
  CAKE_CHECK(!shards.empty(), cakeInvalidArgument, "shards must hold W >= 1 ranks, got 0");
  CAKE_CHECK(num_v_heads >= 1 && head_dim_k >= 1 && head_dim_v >= 1, cakeInvalidArgument,
             "num_v_heads, head_dim_k and head_dim_v must be >= 1, got ", num_v_heads, ", ",
             head_dim_k, " and ", head_dim_v);
  SummaryExchange x;
  x.record_bytes = num_v_heads * head_dim_k * (head_dim_k + head_dim_v) * 4;
  for (RankShard const& shard : shards) {
    x.forward_slots = std::max(x.forward_slots, shard.num_summaries);
    x.backward_slots = std::max(x.backward_slots, shard.num_adjoints);
  }
  int64_t const others = static_cast<int64_t>(shards.size()) - 1;
  x.forward_send_bytes = x.forward_slots * x.record_bytes;
  x.forward_receive_bytes = others * x.forward_send_bytes;
  x.backward_send_bytes = x.backward_slots * x.record_bytes;
  x.backward_receive_bytes = others * x.backward_send_bytes;
  return x;
}

}  // namespace cake::plan
