// The chunk slots of packed documents (src/kernels/common/problem.hpp): every chunk of every
// document sits in exactly one slot below num_slots, find_chunk returns it with its tokens, and
// every other slot is empty. The host path (binary search) runs here; the device path (one round
// of loads per warp for fewer than 32 documents) runs in the GPU tests, whose cases hold both
// fewer and more than 32 documents.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/common/problem.hpp"

namespace {

using cake::kernels::ChunkRef;
using cake::kernels::find_chunk;
using cake::kernels::kChunk;
using cake::kernels::Problem;
using cake::kernels::slots_for;

// Checks every slot of a problem over documents of the given lengths.
void expect_slots_cover_chunks(std::vector<int64_t> const& lengths) {
  std::vector<int32_t> cu{0};
  for (int64_t len : lengths) cu.push_back(cu.back() + static_cast<int32_t>(len));
  Problem p;
  p.num_seqs = static_cast<int32_t>(lengths.size());
  p.num_tokens = cu.back();
  p.num_slots = slots_for(p.num_tokens, p.num_seqs);
  p.cu_seqlens32 = cu.data();

  // The chunks in document order, as the slots must hold them.
  std::vector<ChunkRef> expected;
  for (int32_t n = 0; n < p.num_seqs; ++n) {
    int32_t const num_chunks = static_cast<int32_t>((lengths[n] + kChunk - 1) / kChunk);
    for (int32_t j = 0; j < num_chunks; ++j) {
      int64_t const t0 = cu[n] + int64_t{j} * kChunk;
      int32_t const len = static_cast<int32_t>(std::min<int64_t>(kChunk, cu[n + 1] - t0));
      expected.push_back(ChunkRef{t0, len, n, j, num_chunks});
    }
  }
  size_t next = 0;
  for (int64_t slot = 0; slot < p.num_slots + 3; ++slot) {
    ChunkRef c{};
    if (!find_chunk(p, slot, c)) continue;
    ASSERT_LT(slot, p.num_slots) << "a chunk past num_slots";
    ASSERT_LT(next, expected.size()) << "more chunks than the documents hold";
    ChunkRef const& e = expected[next++];
    EXPECT_EQ(c.n, e.n) << "slot " << slot;
    EXPECT_EQ(c.j, e.j) << "slot " << slot;
    EXPECT_EQ(c.t0, e.t0) << "slot " << slot;
    EXPECT_EQ(c.len, e.len) << "slot " << slot;
    EXPECT_EQ(c.num_chunks, e.num_chunks) << "slot " << slot;
  }
  EXPECT_EQ(next, expected.size()) << "chunks that no slot holds";
}

TEST(Slots, EdgeLengths) {
  expect_slots_cover_chunks({1});
  expect_slots_cover_chunks({64});
  expect_slots_cover_chunks({1, 63, 64, 65, 1000});
  expect_slots_cover_chunks({65, 300, 1});
  expect_slots_cover_chunks({128, 128, 127, 129});
}

TEST(Slots, ManyShortOneLong) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < 40; ++i) lengths.push_back(1 + 6 * (i % 20));
  lengths.push_back(3000);
  expect_slots_cover_chunks(lengths);
}

TEST(Slots, RandomDocuments) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> count(1, 70);
  std::uniform_int_distribution<int> length(1, 400);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> lengths(count(rng));
    for (auto& len : lengths) len = length(rng);
    expect_slots_cover_chunks(lengths);
  }
}

TEST(Slots, EqualLengthsWithoutOffsets) {
  Problem p;
  p.num_seqs = 3;
  p.seq_len = 130;  // chunks of 64, 64, 2 tokens per document
  p.num_tokens = 3 * 130;
  p.num_slots = slots_for(p.num_tokens, p.num_seqs);
  int found = 0;
  for (int64_t slot = 0; slot < p.num_slots; ++slot) {
    ChunkRef c{};
    if (!find_chunk(p, slot, c)) continue;
    EXPECT_EQ(c.t0, int64_t{c.n} * 130 + int64_t{c.j} * kChunk);
    EXPECT_EQ(c.len, c.j < 2 ? kChunk : 2);
    ++found;
  }
  EXPECT_EQ(found, 9);
}

}  // namespace
