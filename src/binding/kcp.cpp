// cake._C.kcp: the context-parallel planning of src/plan (partitions, fragments, exchange sizes,
// segment plan) for cake/kcp, each function returning (code, message, value) (result.hpp). Pure host code over plain Python values; the fragment tables are
// small read-only objects that cake/kcp turns into dataclasses.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "binding/result.hpp"
#include "core/error.hpp"
#include "plan/partition.hpp"
#include "plan/segments.hpp"

namespace nb = nanobind;

namespace {

using cake::plan::Layout;
using cake::plan::RankShard;
using cake::plan::TokenRange;

using cake::binding::result;

Layout parse_layout(std::string const& name) {
  for (Layout layout : {Layout::kContiguous, Layout::kZigzag, Layout::kZigzagPerDocument}) {
    if (cake::plan::layout_name(layout) == name) return layout;
  }
  throw cake::Error(cakeInvalidArgument,
                    cake::concat("layout must be one of 'contiguous', 'zigzag', "
                                 "'zigzag_per_document', got '", name, "'"));
}

// Ranges as (begin, end) pairs: [W][ranges].
using RangePairs = std::vector<std::vector<std::pair<int64_t, int64_t>>>;

RangePairs to_pairs(std::vector<std::vector<TokenRange>> const& ranges) {
  RangePairs out(ranges.size());
  for (size_t r = 0; r < ranges.size(); ++r) {
    for (TokenRange const& x : ranges[r]) out[r].emplace_back(x.begin, x.end);
  }
  return out;
}

std::vector<std::vector<TokenRange>> from_pairs(RangePairs const& pairs) {
  std::vector<std::vector<TokenRange>> out(pairs.size());
  for (size_t r = 0; r < pairs.size(); ++r) {
    for (auto const& [begin, end] : pairs[r]) out[r].push_back(TokenRange{begin, end});
  }
  return out;
}

}  // namespace

void bind_kcp(nb::module_& m) {
  nb::module_ kcp = m.def_submodule("kcp", "Context-parallel planning (src/plan); use cake.kcp.");

  nb::class_<TokenRange>(kcp, "TokenRange")
      .def_ro("begin", &TokenRange::begin)
      .def_ro("end", &TokenRange::end);

  nb::class_<cake::plan::FragmentRef>(kcp, "FragmentRef")
      .def_ro("rank", &cake::plan::FragmentRef::rank)
      .def_ro("index", &cake::plan::FragmentRef::index);

  nb::class_<cake::plan::Fragment>(kcp, "Fragment")
      .def_ro("document", &cake::plan::Fragment::document)
      .def_ro("piece", &cake::plan::Fragment::piece)
      .def_ro("num_pieces", &cake::plan::Fragment::num_pieces)
      .def_ro("global_range", &cake::plan::Fragment::global)
      .def_ro("local_range", &cake::plan::Fragment::local)
      .def_ro("state_in", &cake::plan::Fragment::state_in)
      .def_ro("state_out", &cake::plan::Fragment::state_out)
      .def_ro("previous", &cake::plan::Fragment::previous)
      .def_ro("next", &cake::plan::Fragment::next)
      .def_ro("summary_slot", &cake::plan::Fragment::summary_slot)
      .def_ro("adjoint_slot", &cake::plan::Fragment::adjoint_slot);

  nb::class_<RankShard>(kcp, "RankShard")
      .def_ro("rank", &RankShard::rank)
      .def_ro("global_ranges", &RankShard::global_ranges)
      .def_ro("cu_seqlens", &RankShard::cu_seqlens)
      .def_ro("fragments", &RankShard::fragments)
      .def_ro("num_summaries", &RankShard::num_summaries)
      .def_ro("num_adjoints", &RankShard::num_adjoints);

  nb::class_<cake::plan::SummaryExchange>(kcp, "SummaryExchange")
      .def_ro("record_bytes", &cake::plan::SummaryExchange::record_bytes)
      .def_ro("forward_slots", &cake::plan::SummaryExchange::forward_slots)
      .def_ro("backward_slots", &cake::plan::SummaryExchange::backward_slots)
      .def_ro("forward_send_bytes", &cake::plan::SummaryExchange::forward_send_bytes)
      .def_ro("forward_receive_bytes", &cake::plan::SummaryExchange::forward_receive_bytes)
      .def_ro("backward_send_bytes", &cake::plan::SummaryExchange::backward_send_bytes)
      .def_ro("backward_receive_bytes", &cake::plan::SummaryExchange::backward_receive_bytes);

  kcp.attr("CHUNK_SIZE") = cake::plan::kChunkSize;
  kcp.attr("MAX_SEGMENTS") = cake::plan::kMaxSegments;

  kcp.def(
      "partition",
      [](std::vector<int64_t> const& cu_seqlens, int world_size, std::string const& layout) {
        return result([&] {
          return cake::plan::partition(cu_seqlens, world_size, parse_layout(layout));
        });
      },
      nb::arg("cu_seqlens"), nb::arg("world_size"), nb::arg("layout"),
      "The shards of the batch for every rank: [W] RankShard.");

  kcp.def(
      "layout_ranges",
      [](std::vector<int64_t> const& cu_seqlens, int world_size, std::string const& layout) {
        return result([&] {
          return to_pairs(cake::plan::layout_ranges(cu_seqlens, world_size, parse_layout(layout)));
        });
      },
      nb::arg("cu_seqlens"), nb::arg("world_size"), nb::arg("layout"),
      "Every rank's global token ranges in local order: [W][(begin, end)].");

  kcp.def(
      "partition_ranges",
      [](std::vector<int64_t> const& cu_seqlens, RangePairs const& rank_ranges) {
        return result(
            [&] { return cake::plan::partition_ranges(cu_seqlens, from_pairs(rank_ranges)); });
      },
      nb::arg("cu_seqlens"), nb::arg("rank_ranges"),
      "The shards for explicit per-rank ranges [W][(begin, end)], which must tile [0, T).");

  kcp.def(
      "summary_exchange",
      [](std::vector<RankShard> const& shards, int64_t num_v_heads, int64_t head_dim_k,
         int64_t head_dim_v) {
        return result([&] {
          return cake::plan::summary_exchange(shards, num_v_heads, head_dim_k, head_dim_v);
        });
      },
      nb::arg("shards"), nb::arg("num_v_heads"), nb::arg("head_dim_k"), nb::arg("head_dim_v"),
      "Bytes of the forward and backward summary exchange (FP32 records).");

  kcp.def(
      "plan_segments",
      [](std::vector<RankShard> const& shards, int64_t num_v_heads, int num_sms, int segments) {
        return result([&] {
          return cake::plan::plan_segments(shards, num_v_heads, num_sms, segments);
        });
      },
      nb::arg("shards"), nb::arg("num_v_heads"), nb::arg("num_sms"), nb::arg("segments") = 0,
      "P for every rank: [W]; segments = 0 applies the rule, 1..16 forces P.");

  kcp.def(
      "segment_bounds",
      [](int64_t num_chunks, int segments) {
        return result([&] { return cake::plan::segment_bounds(num_chunks, segments); });
      },
      nb::arg("num_chunks"), nb::arg("segments"),
      "Chunk bounds [S + 1] of a fragment of num_chunks chunks cut into at most P segments.");
}
