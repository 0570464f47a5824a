//===- LayoutTest.cpp - Packing, mesh ranges, pieces, verification --------===//
//
// Fixed vectors are the test vectors (upstream Megatron-FSDP unit tests) and
// the worked example of docs/MegatronFSDPLayout.md. The property tests
// compare the library against a deliberately plain restatement of its
// packing, rank range and piece rules written below (list-based packing,
// closed-form shard index, element-by-element buffer simulation).
//
//===----------------------------------------------------------------------===//

#include "fsdp/Layout/Layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <list>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace fsdp {
namespace layout {
// Readable values in failure messages.
void PrintTo(const Range &range, std::ostream *os) {
  *os << "[" << range.begin << ", " << range.end << ")";
}
void PrintTo(const Piece &piece, std::ostream *os) {
  *os << "{rowOffset " << piece.rowOffset << ", rows " << piece.rows << ", localOffset "
      << piece.localOffset << "}";
}
} // namespace layout
} // namespace fsdp

using namespace fsdp::layout;

// gtest assertions in the per-piece loops of the property tests cost seconds
// in unoptimized builds; these check with a plain `if` and build a message
// only on failure (returning from the test like ASSERT_*).
#define REQUIRE(cond)                                                                              \
  if (cond) {                                                                                      \
  } else                                                                                           \
    FAIL() << "check failed: " #cond " "
#define REQUIRE_EQ(a, b)                                                                           \
  if ((a) == (b)) {                                                                                \
  } else                                                                                           \
    FAIL() << "expected " #a " == " #b ": " << ::testing::PrintToString(a) << " vs "               \
           << ::testing::PrintToString(b) << " "

namespace {

constexpr Placement R = Placement::Replicate;
constexpr Placement S = Placement::Shard;

PackedLayout mustPack(const std::vector<Shape> &shapes, int64_t dpSize) {
  fsdp::Result<PackedLayout> packed = packGroup(shapes, dpSize);
  EXPECT_TRUE(packed.ok()) << (packed.ok() ? "" : packed.error());
  return packed.ok() ? *packed : PackedLayout{};
}

/// Local shape of a piece: (rows, shape[1:]...).
Shape localShape(const Piece &piece, const Shape &shape) {
  Shape local = shape;
  local[0] = piece.rows;
  return local;
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

//===----------------------------------------------------------------------===//
// Test vectors (docs/MegatronFSDPLayout.md): upstream Megatron-FSDP tests
//===----------------------------------------------------------------------===//

TEST(LayoutVectors, PadsToLcm) {
  PackedLayout layout = mustPack({{5, 4}, {2, 6}, {3}}, 2);
  EXPECT_EQ(layout.chunk, 12);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 24, 20}));
  EXPECT_EQ(layout.size, 48);
}

TEST(LayoutVectors, AlignsFragment) {
  PackedLayout layout = mustPack({{4, 4}, {1, 6}}, 2);
  EXPECT_EQ(layout.chunk, 12);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 18}));
  EXPECT_EQ(layout.size, 24);
}

TEST(LayoutVectors, FillsGapsFiveRanks) {
  const std::vector<Shape> shapes = {{2, 6}, {4, 4}, {4, 4}, {1, 2}, {1, 6}};
  PackedLayout layout = mustPack(shapes, 5);
  EXPECT_EQ(layout.chunk, 12);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 12, 32, 28, 48}));
  EXPECT_EQ(layout.size, 60);
  ASSERT_TRUE(verifyLayout(shapes, layout, {5}, {S}));

  // rows[rank][tensor]: r0 P0 (2,6); r1 P1 (3,4); r2 P1 (1,4), P2 (1,4),
  // P3 (1,2); r3 P2 (3,4); r4 P4 (1,6).
  const int64_t expectedRows[5][5] = {
      {2, 0, 0, 0, 0}, {0, 3, 0, 0, 0}, {0, 1, 1, 1, 0}, {0, 0, 3, 0, 0}, {0, 0, 0, 0, 1}};
  std::vector<Range> ranges = rankRanges(layout.size, {5}, {S});
  ASSERT_EQ(ranges.size(), 5u);
  for (int rank = 0; rank < 5; ++rank) {
    EXPECT_EQ(ranges[rank], (Range{12 * rank, 12 * rank + 12}));
    for (int t = 0; t < 5; ++t) {
      Piece piece = pieceOf(layout.offsets[t], shapes[t], ranges[rank]);
      Shape expected = shapes[t];
      expected[0] = expectedRows[rank][t];
      EXPECT_EQ(localShape(piece, shapes[t]), expected) << "rank " << rank << " P" << t;
    }
  }
}

TEST(LayoutVectors, CheckpointFc1NineSeven) {
  const std::vector<Shape> shapes = {{16, 8}, {16}};
  PackedLayout layout = mustPack(shapes, 2);
  EXPECT_EQ(layout.chunk, 8);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 128}));
  EXPECT_EQ(layout.size, 144);
  std::vector<Range> ranges = rankRanges(layout.size, {2}, {S});
  EXPECT_EQ(pieceOf(0, shapes[0], ranges[0]), (Piece{0, 9, 0}));
  EXPECT_EQ(pieceOf(0, shapes[0], ranges[1]), (Piece{9, 7, 0}));
  EXPECT_EQ(pieceOf(128, shapes[1], ranges[0]).rows, 0);
  EXPECT_EQ(pieceOf(128, shapes[1], ranges[1]), (Piece{0, 16, 56}));
  // The upstream docstring's point: canonical Shard(0) would say 8/8.
  EXPECT_EQ(canonicalShardRows(16, 2, 0), (Range{0, 8}));
  EXPECT_EQ(canonicalShardRows(16, 2, 1), (Range{8, 16}));
  EXPECT_TRUE(differsFromCanonical(0, shapes[0], layout.size, {2}, {S}));
  EXPECT_TRUE(differsFromCanonical(128, shapes[1], layout.size, {2}, {S}));
}

TEST(LayoutVectors, PackedBlock) {
  const std::vector<Shape> shapes = {{4, 4}, {2, 2}, {2, 6}};
  PackedLayout layout = mustPack(shapes, 2);
  EXPECT_EQ(layout.chunk, 12);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 16, 24}));
  EXPECT_EQ(layout.size, 48);
  std::vector<Range> ranges = rankRanges(layout.size, {2}, {S});
  EXPECT_EQ(pieceOf(0, shapes[0], ranges[0]), (Piece{0, 4, 0}));
  EXPECT_EQ(pieceOf(16, shapes[1], ranges[0]), (Piece{0, 2, 16}));
  EXPECT_TRUE(pieceOf(24, shapes[2], ranges[0]).empty());
  EXPECT_TRUE(pieceOf(0, shapes[0], ranges[1]).empty());
  EXPECT_TRUE(pieceOf(16, shapes[1], ranges[1]).empty());
  EXPECT_EQ(pieceOf(24, shapes[2], ranges[1]), (Piece{0, 2, 0}));
}

TEST(LayoutVectors, TiedWeightAnyWorldSize) {
  for (int64_t dp : {1, 2, 4, 8}) {
    PackedLayout layout = mustPack({{8, 4}}, dp);
    EXPECT_EQ(layout.chunk, 4) << "dp " << dp;
    EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0})) << "dp " << dp;
    EXPECT_EQ(layout.size, 32) << "dp " << dp;
    EXPECT_TRUE(verifyLayout({{8, 4}}, layout, {dp}, {S})) << "dp " << dp;
  }
}

//===----------------------------------------------------------------------===//
// Worked example (docs/MegatronFSDPLayout.md): P0 = [5,3], P1 = [7], P2 = [4,4]
//===----------------------------------------------------------------------===//

const std::vector<Shape> kExample = {{5, 3}, {7}, {4, 4}};

TEST(WorkedExample, PackingFsdp4) {
  PackedLayout layout = mustPack(kExample, 4);
  EXPECT_EQ(layout.chunk, 12);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 36, 20}));
  EXPECT_EQ(layout.size, 48);
  EXPECT_TRUE(verifyLayout(kExample, layout, {4}, {S}));
  std::vector<Range> ranges = rankRanges(layout.size, {4}, {S});
  EXPECT_EQ(ranges, (std::vector<Range>{{0, 12}, {12, 24}, {24, 36}, {36, 48}}));
}

TEST(WorkedExample, PiecesTable) {
  PackedLayout layout = mustPack(kExample, 4);
  std::vector<Range> ranges = rankRanges(layout.size, {4}, {S});
  // {rowOffset, rows, localOffset}; empty pieces report the rows lower ranks
  // own (P0 on ranks 2-3: 5; P2 on rank 3: 4) and local offset 0.
  const Piece expected[3][4] = {{{0, 4, 0}, {4, 1, 0}, {5, 0, 0}, {5, 0, 0}},  // P0 [5,3]
                                {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 7, 0}},  // P1 [7]
                                {{0, 0, 0}, {0, 1, 8}, {1, 3, 0}, {4, 0, 0}}}; // P2 [4,4]
  for (int t = 0; t < 3; ++t)
    for (int rank = 0; rank < 4; ++rank)
      EXPECT_EQ(pieceOf(layout.offsets[t], kExample[t], ranges[rank]), expected[t][rank])
          << "P" << t << " rank " << rank;
}

TEST(WorkedExample, CanonicalShard0Differs) {
  // P0 rows 2/2/1/0, P1 2/2/2/1, P2 1/1/1/1.
  EXPECT_EQ(canonicalShardRows(5, 4, 0), (Range{0, 2}));
  EXPECT_EQ(canonicalShardRows(5, 4, 1), (Range{2, 4}));
  EXPECT_EQ(canonicalShardRows(5, 4, 2), (Range{4, 5}));
  EXPECT_EQ(canonicalShardRows(5, 4, 3).size(), 0);
  const int64_t p1Rows[4] = {2, 2, 2, 1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(canonicalShardRows(7, 4, i).size(), p1Rows[i]);
    EXPECT_EQ(canonicalShardRows(4, 4, i), (Range{i, i + 1}));
  }
  PackedLayout layout = mustPack(kExample, 4);
  for (int t = 0; t < 3; ++t)
    EXPECT_TRUE(differsFromCanonical(layout.offsets[t], kExample[t], layout.size, {4}, {S}))
        << "P" << t;
  // An evenly split tensor does not differ.
  EXPECT_FALSE(differsFromCanonical(0, {8, 4}, 32, {4}, {S}));
  // Nothing differs when nothing is sharded.
  EXPECT_FALSE(differsFromCanonical(0, {5, 3}, 48, {4}, {R}));
}

TEST(WorkedExample, Hsdp) {
  const std::vector<int64_t> mesh = {2, 2};
  const std::vector<Placement> placements = {R, S};
  PackedLayout layout = mustPack(kExample, meshSize(mesh));
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 36, 20}));
  EXPECT_EQ(layout.size, 48);
  ASSERT_TRUE(verifyLayout(kExample, layout, mesh, placements));
  EXPECT_EQ(numShards(mesh, placements), 2);

  std::vector<Range> ranges = rankRanges(layout.size, mesh, placements);
  // Flat rank of (o, i) is o * 2 + i; both replicas hold the same ranges.
  EXPECT_EQ(ranges, (std::vector<Range>{{0, 24}, {24, 48}, {0, 24}, {24, 48}}));
  for (int64_t o = 0; o < 2; ++o) {
    Range inner0 = ranges[flatRank({o, 0}, mesh)];
    Range inner1 = ranges[flatRank({o, 1}, mesh)];
    EXPECT_EQ(pieceOf(0, kExample[0], inner0), (Piece{0, 5, 0}));
    EXPECT_EQ(pieceOf(20, kExample[2], inner0), (Piece{0, 1, 20}));
    EXPECT_TRUE(pieceOf(36, kExample[1], inner0).empty());
    EXPECT_EQ(pieceOf(20, kExample[2], inner1), (Piece{1, 3, 0}));
    EXPECT_EQ(pieceOf(36, kExample[1], inner1), (Piece{0, 7, 12}));
    EXPECT_EQ(pieceOf(0, kExample[0], inner1), (Piece{5, 0, 0}));
    EXPECT_EQ(shardIndex(flatRank({o, 0}, mesh), mesh, placements), 0);
    EXPECT_EQ(shardIndex(flatRank({o, 1}, mesh), mesh, placements), 1);
  }
}

TEST(WorkedExample, Hfsdp) {
  const std::vector<int64_t> mesh = {2, 2};
  const std::vector<Placement> placements = {S, S};
  PackedLayout layout = mustPack(kExample, meshSize(mesh));
  ASSERT_TRUE(verifyLayout(kExample, layout, mesh, placements));
  EXPECT_EQ(numShards(mesh, placements), 4);
  // (o, i) owns [24 i + 12 o, +12).
  for (int64_t o = 0; o < 2; ++o)
    for (int64_t i = 0; i < 2; ++i) {
      const int64_t rank = flatRank({o, i}, mesh);
      EXPECT_EQ(rank, o * 2 + i);
      EXPECT_EQ(localRange(layout.size, mesh, {o, i}, placements),
                (Range{24 * i + 12 * o, 24 * i + 12 * o + 12}));
      // Buffer order is 2i + o: the row of the 4-rank worked example.
      EXPECT_EQ(shardIndex(rank, mesh, placements), 2 * i + o);
      EXPECT_EQ(shardCoords(2 * i + o, mesh, placements), (std::vector<int64_t>{o, i}));
    }
  std::vector<Range> ranges = rankRanges(layout.size, mesh, placements);
  EXPECT_EQ(ranges, (std::vector<Range>{{0, 12}, {24, 36}, {12, 24}, {36, 48}}));
  // The 4-rank worked example's pieces, reached through shard 2i + o.
  EXPECT_EQ(pieceOf(0, kExample[0], ranges[flatRank({1, 0}, mesh)]), (Piece{4, 1, 0}));
  EXPECT_EQ(pieceOf(20, kExample[2], ranges[flatRank({1, 0}, mesh)]), (Piece{0, 1, 8}));
  EXPECT_EQ(pieceOf(20, kExample[2], ranges[flatRank({0, 1}, mesh)]), (Piece{1, 3, 0}));
  EXPECT_EQ(pieceOf(36, kExample[1], ranges[flatRank({1, 1}, mesh)]), (Piece{0, 7, 0}));
  // The HSDP parameter range of inner rank i contains the optimizer range.
  std::vector<Range> hsdp = rankRanges(layout.size, mesh, {R, S});
  for (size_t rank = 0; rank < ranges.size(); ++rank) {
    EXPECT_LE(hsdp[rank].begin, ranges[rank].begin);
    EXPECT_GE(hsdp[rank].end, ranges[rank].end);
  }
}

TEST(WorkedExample, HfsdpCanonicalUsesMeshOrder) {
  // DTensor Shard(0) on (Shard, Shard) splits mesh axis 0 first, the buffer
  // splits the last axis first, so even an evenly divisible tensor differs.
  const std::vector<int64_t> mesh = {2, 2};
  EXPECT_EQ(canonicalRowsForCoords(8, mesh, {0, 1}, {S, S}), (Range{2, 4}));
  EXPECT_EQ(canonicalRowsForCoords(8, mesh, {1, 0}, {S, S}), (Range{4, 6}));
  // Nested ceil-div: 5 rows -> 3 / 2 on axis 0, then 2/1 and 1/1.
  EXPECT_EQ(canonicalRowsForCoords(5, mesh, {0, 0}, {S, S}), (Range{0, 2}));
  EXPECT_EQ(canonicalRowsForCoords(5, mesh, {0, 1}, {S, S}), (Range{2, 3}));
  EXPECT_EQ(canonicalRowsForCoords(5, mesh, {1, 0}, {S, S}), (Range{3, 4}));
  EXPECT_EQ(canonicalRowsForCoords(5, mesh, {1, 1}, {S, S}), (Range{4, 5}));
  EXPECT_TRUE(differsFromCanonical(0, {8, 4}, 32, mesh, {S, S}));
  EXPECT_FALSE(differsFromCanonical(0, {8, 4}, 32, mesh, {R, S}));
}

//===----------------------------------------------------------------------===//
// Packing rules, hand-computed
//===----------------------------------------------------------------------===//

TEST(Packing, ConjugateIsFirstThatFits) {
  // chunk 12. [20] leaves remainder 8: [30] (remainder 6) does not fit, [15]
  // (remainder 3) does and ends at the boundary 36; [30] follows at 48.
  const std::vector<Shape> shapes = {{1, 12}, {20}, {30}, {15}};
  PackedLayout layout = mustPack(shapes, 1);
  EXPECT_EQ(layout.chunk, 12);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 12, 48, 33}));
  EXPECT_EQ(layout.size, 84);
  EXPECT_TRUE(verifyLayout(shapes, layout, {1}, {S}));
}

TEST(Packing, FragmentsLargestFirstStableAndRowAligned) {
  // Hole [26, 36) after [14]: [3,3] aligns to 27 and fills it; the two
  // 4-element fragments tie and go to the tail in group order.
  PackedLayout layout = mustPack({{1, 12}, {14}, {4}, {2, 2}, {3, 3}}, 1);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 12, 36, 40, 27}));
  EXPECT_EQ(layout.size, 48);
  layout = mustPack({{1, 12}, {14}, {2, 2}, {4}, {3, 3}}, 1);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 12, 36, 40, 27}));
}

TEST(Packing, ManyFragmentTiesKeepGroupOrder) {
  // Enough fragments that an unstable sort would reorder ties: all go to the
  // tail after [1,60], largest first, ties in group order.
  std::vector<Shape> shapes = {{1, 60}};
  for (int i = 0; i < 64; ++i)
    shapes.push_back({(i * 7) % 4 + 1});
  PackedLayout layout = mustPack(shapes, 1);
  ASSERT_EQ(layout.chunk, 60);
  int64_t next = 60;
  for (int64_t numel = 4; numel >= 1; --numel)
    for (size_t t = 1; t < shapes.size(); ++t)
      if (shapes[t][0] == numel) {
        EXPECT_EQ(layout.offsets[t], next) << "tensor " << t;
        next += numel;
      }
  EXPECT_EQ(layout.size, 240);
}

TEST(Packing, EmptyGroup) {
  PackedLayout layout = mustPack({}, 4);
  EXPECT_EQ(layout.chunk, 1);
  EXPECT_EQ(layout.size, 0);
  EXPECT_TRUE(layout.offsets.empty());
  EXPECT_TRUE(verifyLayout({}, layout, {4}, {S}));
}

TEST(Shapes, Helpers) {
  EXPECT_EQ(numElements({}), 1);
  EXPECT_EQ(numElements({5, 3}), 15);
  EXPECT_EQ(rowSize({7}), 1);
  EXPECT_EQ(rowSize({5, 3, 2}), 6);
  EXPECT_TRUE(checkShape({1}));
  EXPECT_FALSE(checkShape({}));
  EXPECT_FALSE(checkShape({2, 0}));
  fsdp::Result<int64_t> big = checkedNumElements({int64_t(1) << 40, int64_t(1) << 30});
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(contains(big.error(), "overflow"));
}

TEST(Mesh, FlatRankRoundTrip) {
  const std::vector<int64_t> mesh = {3, 1, 4, 2};
  for (int64_t rank = 0; rank < meshSize(mesh); ++rank)
    EXPECT_EQ(flatRank(rankCoords(rank, mesh), mesh), rank);
  EXPECT_EQ(rankCoords(23, mesh), (std::vector<int64_t>{2, 0, 3, 1}));
  EXPECT_EQ(meshSize({}), 1);
  EXPECT_EQ(rankRanges(10, {}, {}), (std::vector<Range>{{0, 10}}));
}

//===----------------------------------------------------------------------===//
// Error paths
//===----------------------------------------------------------------------===//

TEST(Errors, PackRejectsBadShapes) {
  fsdp::Result<PackedLayout> scalar = packGroup({{4}, {}}, 2);
  ASSERT_FALSE(scalar.ok());
  EXPECT_TRUE(contains(scalar.error(), "tensor 1")) << scalar.error();
  EXPECT_TRUE(contains(scalar.error(), "rank-0")) << scalar.error();

  fsdp::Result<PackedLayout> zero = packGroup({{4, 0}}, 2);
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(contains(zero.error(), "tensor 0")) << zero.error();
  fsdp::Result<PackedLayout> negative = packGroup({{3}, {-2, 5}}, 2);
  ASSERT_FALSE(negative.ok());
  EXPECT_TRUE(contains(negative.error(), "tensor 1")) << negative.error();

  for (int64_t dp : {0, -3}) {
    fsdp::Result<PackedLayout> badDp = packGroup({{4}}, dp);
    ASSERT_FALSE(badDp.ok());
    EXPECT_TRUE(contains(badDp.error(), "data-parallel size")) << badDp.error();
  }
}

TEST(Errors, PackRejectsOverflow) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  // Element count.
  fsdp::Result<PackedLayout> numel = packGroup({{max / 2, 3}}, 1);
  ASSERT_FALSE(numel.ok());
  EXPECT_TRUE(contains(numel.error(), "overflow")) << numel.error();
  // lcm of pairwise coprime row sizes near 2^31.
  fsdp::Result<PackedLayout> lcm =
      packGroup({{1, 2147483647}, {1, int64_t(1) << 31}, {1, 1162261467}}, 1);
  ASSERT_FALSE(lcm.ok());
  EXPECT_TRUE(contains(lcm.error(), "chunk")) << lcm.error();
  // chunk * dpSize.
  fsdp::Result<PackedLayout> granule = packGroup({{1, int64_t(1) << 40}}, int64_t(1) << 30);
  ASSERT_FALSE(granule.ok());
  EXPECT_TRUE(contains(granule.error(), "overflow")) << granule.error();
  // Running buffer size.
  fsdp::Result<PackedLayout> size = packGroup({{int64_t(1) << 62}, {int64_t(1) << 62}}, 1);
  ASSERT_FALSE(size.ok());
  EXPECT_TRUE(contains(size.error(), "buffer size")) << size.error();
  // Padding the last tensor up to chunk * dp.
  fsdp::Result<PackedLayout> padding = packGroup({{max - 5}}, 8);
  ASSERT_FALSE(padding.ok());
  EXPECT_TRUE(contains(padding.error(), "overflow")) << padding.error();
}

TEST(Errors, Placements) {
  EXPECT_TRUE(checkPlacements({2, 2}, {R, S}));
  EXPECT_TRUE(checkPlacements({2, 2}, {S, S}));
  EXPECT_TRUE(checkPlacements({2, 2}, {R, R}));
  EXPECT_TRUE(checkPlacements({}, {}));

  fsdp::Status nonSuffix = checkPlacements({2, 2}, {S, R});
  ASSERT_FALSE(nonSuffix.ok());
  EXPECT_TRUE(contains(nonSuffix.error(), "suffix")) << nonSuffix.error();
  fsdp::Status gap = checkPlacements({2, 2, 2}, {S, R, S});
  ASSERT_FALSE(gap.ok());
  EXPECT_TRUE(contains(gap.error(), "axis 0")) << gap.error();

  fsdp::Status count = checkPlacements({2, 2}, {S});
  ASSERT_FALSE(count.ok());
  EXPECT_TRUE(contains(count.error(), "2 axes but 1 placements")) << count.error();

  fsdp::Status size = checkPlacements({2, 0}, {R, S});
  ASSERT_FALSE(size.ok());
  EXPECT_TRUE(contains(size.error(), "axis 1")) << size.error();

  fsdp::Status overflow = checkPlacements({int64_t(1) << 32, int64_t(1) << 32}, {R, S});
  ASSERT_FALSE(overflow.ok());
  EXPECT_TRUE(contains(overflow.error(), "overflow")) << overflow.error();
}

class CorruptedLayout : public ::testing::Test {
protected:
  // The worked example: P0 [0,15), P2 [20,36), P1 [36,43), size 48, chunk 12.
  PackedLayout good = mustPack(kExample, 4);
  const std::vector<int64_t> mesh = {4};
  const std::vector<Placement> placements = {S};

  std::string rejection(const PackedLayout &layout, const std::vector<Shape> &shapes = kExample) {
    fsdp::Status status = verifyLayout(shapes, layout, mesh, placements);
    EXPECT_FALSE(status.ok()) << "layout was accepted";
    return status.ok() ? std::string() : status.error();
  }
};

TEST_F(CorruptedLayout, GoodOneVerifies) {
  EXPECT_TRUE(verifyLayout(kExample, good, mesh, placements));
}

TEST_F(CorruptedLayout, OverlappingOffsets) {
  PackedLayout bad = good;
  bad.offsets[2] = 12; // P2 [12,28) over P0 [0,15)
  std::string error = rejection(bad);
  EXPECT_TRUE(contains(error, "tensor 2")) << error;
  EXPECT_TRUE(contains(error, "overlaps tensor 0")) << error;
}

TEST_F(CorruptedLayout, MisalignedOffset) {
  PackedLayout bad = good;
  bad.offsets[2] = 22;
  std::string error = rejection(bad);
  EXPECT_TRUE(contains(error, "tensor 2")) << error;
  EXPECT_TRUE(contains(error, "row size 4")) << error;
}

TEST_F(CorruptedLayout, SizeNotPadded) {
  PackedLayout bad = good;
  bad.size = 44;
  std::string error = rejection(bad);
  EXPECT_TRUE(contains(error, "size 44")) << error;
  EXPECT_TRUE(contains(error, "chunk * mesh size")) << error;
}

TEST_F(CorruptedLayout, OutOfRange) {
  PackedLayout bad = good;
  bad.offsets[1] = 44; // P1 [44,51) past 48
  std::string error = rejection(bad);
  EXPECT_TRUE(contains(error, "tensor 1")) << error;
  EXPECT_TRUE(contains(error, "run past the buffer size 48")) << error;

  bad = good;
  bad.offsets[0] = -3;
  error = rejection(bad);
  EXPECT_TRUE(contains(error, "tensor 0")) << error;
  EXPECT_TRUE(contains(error, "negative")) << error;
}

TEST_F(CorruptedLayout, ChunkNotMultipleOfRowSize) {
  PackedLayout bad = good;
  bad.chunk = 6; // 48 is still a multiple of 6 * 4
  std::string error = rejection(bad);
  EXPECT_TRUE(contains(error, "tensor 2")) << error;
  EXPECT_TRUE(contains(error, "chunk 6")) << error;
}

TEST_F(CorruptedLayout, CountsShapesAndMesh) {
  PackedLayout bad = good;
  bad.offsets.pop_back();
  EXPECT_TRUE(contains(rejection(bad), "2 offsets for 3 tensors"));

  std::vector<Shape> shapes = kExample;
  shapes[1] = {};
  std::string error = rejection(good, shapes);
  EXPECT_TRUE(contains(error, "tensor 1")) << error;

  bad = good;
  bad.chunk = 0;
  EXPECT_TRUE(contains(rejection(bad), "chunk"));

  fsdp::Status badMesh = verifyLayout(kExample, good, {2, 2}, {S, R});
  ASSERT_FALSE(badMesh.ok());
  EXPECT_TRUE(contains(badMesh.error(), "suffix"));
}

//===----------------------------------------------------------------------===//
// A plain restatement of the layout rules for the property tests.
//===----------------------------------------------------------------------===//

namespace ref {

int64_t product(const Shape &shape, size_t from) {
  int64_t value = 1;
  for (size_t i = from; i < shape.size(); ++i)
    value *= shape[i];
  return value;
}

int64_t gcd(int64_t a, int64_t b) {
  while (b != 0) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

int64_t padTo(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/// GlobalLayout.build transcribed with lists, as in the pseudo-code.
PackedLayout pack(const std::vector<Shape> &shapes, int64_t dpSize) {
  auto numel = [&](int t) { return product(shapes[t], 0); };
  auto rowSize = [&](int t) { return product(shapes[t], 1); };
  PackedLayout out;
  out.chunk = 1;
  for (int t = 0; t < int(shapes.size()); ++t)
    out.chunk = out.chunk / gcd(out.chunk, rowSize(t)) * rowSize(t);
  const int64_t chunk = out.chunk;
  std::list<int> regular, fragments;
  for (int t = 0; t < int(shapes.size()); ++t)
    (numel(t) >= chunk ? regular : fragments).push_back(t);
  fragments.sort([&](int a, int b) { return numel(a) > numel(b); }); // stable
  out.offsets.assign(shapes.size(), -1);
  int64_t next = 0;
  while (!regular.empty()) {
    int t = regular.front();
    regular.pop_front();
    out.offsets[t] = next;
    if (numel(t) % chunk == 0) {
      next += numel(t);
      continue;
    }
    int64_t gap = next + numel(t);
    next += padTo(numel(t), chunk);
    int64_t gapEnd = next;
    const int64_t rem = numel(t) % chunk;
    auto conjugate = std::find_if(regular.begin(), regular.end(), [&](int u) {
      return numel(u) % chunk != 0 && rem + numel(u) % chunk <= chunk;
    });
    if (conjugate != regular.end()) {
      int c = *conjugate;
      regular.erase(conjugate);
      out.offsets[c] = next - numel(c) % chunk;
      gapEnd = out.offsets[c];
      next += numel(c) / chunk * chunk;
    }
    for (auto it = fragments.begin(); it != fragments.end();) {
      int64_t aligned = padTo(gap, rowSize(*it));
      if (aligned + numel(*it) <= gapEnd) {
        out.offsets[*it] = aligned;
        gap = aligned + numel(*it);
        it = fragments.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (int f : fragments) {
    next = padTo(next, rowSize(f));
    out.offsets[f] = next;
    next += numel(f);
  }
  out.size = padTo(next, chunk * dpSize);
  return out;
}

/// Buffer-order index of a rank's piece in closed form: shard axes are
/// digits, the first shard axis the least significant (finest split).
int64_t pieceIndex(const std::vector<int64_t> &coords, const std::vector<int64_t> &mesh,
                   const std::vector<Placement> &placements, int64_t &pieces) {
  int64_t index = 0;
  pieces = 1;
  for (size_t a = 0; a < mesh.size(); ++a)
    if (placements[a] == S) {
      index += coords[a] * pieces;
      pieces *= mesh[a];
    }
  return index;
}

Range rankRange(int64_t size, const std::vector<int64_t> &coords, const std::vector<int64_t> &mesh,
                const std::vector<Placement> &placements) {
  int64_t pieces;
  int64_t index = pieceIndex(coords, mesh, placements, pieces);
  return Range{index * (size / pieces), (index + 1) * (size / pieces)};
}

/// DTensor's canonical Shard(0) rows of every rank, simulated on explicit
/// lists of row indices: each shard axis, in mesh order (axis 0 first),
/// deals the rows it got into torch.chunk pieces of ceil(n / size) rows.
/// Indexed by flat rank; replicate axes copy.
std::vector<std::vector<int64_t>> canonicalRowsByRank(int64_t dim0,
                                                      const std::vector<int64_t> &mesh,
                                                      const std::vector<Placement> &placements) {
  std::vector<std::vector<int64_t>> lists(1);
  for (int64_t r = 0; r < dim0; ++r)
    lists[0].push_back(r);
  // lists is indexed row-major by the coordinates of the axes done so far.
  for (size_t a = 0; a < mesh.size(); ++a) {
    std::vector<std::vector<int64_t>> next;
    for (const std::vector<int64_t> &rows : lists) {
      const size_t per = (rows.size() + mesh[a] - 1) / mesh[a];
      for (int64_t i = 0; i < mesh[a]; ++i) {
        if (placements[a] == R) {
          next.push_back(rows);
          continue;
        }
        const size_t begin = std::min(rows.size(), size_t(i) * per);
        const size_t end = std::min(rows.size(), begin + per);
        next.emplace_back(rows.begin() + begin, rows.begin() + end);
      }
    }
    lists.swap(next);
  }
  return lists;
}

} // namespace ref

struct RandomCase {
  std::vector<Shape> shapes;
  std::vector<int64_t> mesh;
  std::vector<Placement> placements;
};

RandomCase randomCase(std::mt19937_64 &rng) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  RandomCase c;
  const int64_t tensors = uniform(1, 8);
  for (int64_t t = 0; t < tensors; ++t) {
    Shape shape(static_cast<size_t>(uniform(1, 4)));
    for (int64_t &dim : shape)
      dim = uniform(1, 9);
    if (uniform(0, 15) == 0)
      shape[0] = uniform(10, 3000); // occasional large first dim
    c.shapes.push_back(shape);
  }
  const int64_t axes = uniform(1, 3);
  const int64_t shardAxes = uniform(0, axes);
  for (int64_t a = 0; a < axes; ++a) {
    c.mesh.push_back(uniform(1, 5));
    c.placements.push_back(a >= axes - shardAxes ? S : R);
  }
  return c;
}

std::string describe(const RandomCase &c) {
  std::string text = "shapes";
  for (const Shape &shape : c.shapes) {
    text += " [";
    for (size_t i = 0; i < shape.size(); ++i)
      text += (i ? "," : "") + std::to_string(shape[i]);
    text += "]";
  }
  text += " mesh";
  for (size_t a = 0; a < c.mesh.size(); ++a)
    text += " " + std::to_string(c.mesh[a]) + (c.placements[a] == S ? "S" : "R");
  return text;
}

constexpr int kCases = 10000;
// Buffers up to this size are also simulated element by element.
constexpr int64_t kSimulateUpTo = 1 << 14;

TEST(LayoutProperty, MatchesReferenceAndTiles) {
  std::mt19937_64 rng(0x5eed1a40u);
  int simulated = 0, withHoles = 0, differing = 0;
  for (int iter = 0; iter < kCases; ++iter) {
    const RandomCase c = randomCase(rng);
    SCOPED_TRACE("case " + std::to_string(iter) + ": " + describe(c));
    const int64_t ranks = meshSize(c.mesh);
    const int64_t shards = numShards(c.mesh, c.placements);
    ASSERT_TRUE(checkPlacements(c.mesh, c.placements));

    fsdp::Result<PackedLayout> packed = packGroup(c.shapes, ranks);
    ASSERT_TRUE(packed.ok()) << packed.error();
    const PackedLayout &layout = *packed;
    const PackedLayout expected = ref::pack(c.shapes, ranks);
    ASSERT_EQ(layout.chunk, expected.chunk);
    ASSERT_EQ(layout.offsets, expected.offsets);
    ASSERT_EQ(layout.size, expected.size);

    fsdp::Status verified = verifyLayout(c.shapes, layout, c.mesh, c.placements);
    ASSERT_TRUE(verified.ok()) << verified.error();

    // Offsets row-aligned, inside the buffer, pairwise disjoint.
    int64_t used = 0;
    for (size_t t = 0; t < c.shapes.size(); ++t) {
      const int64_t numel = ref::product(c.shapes[t], 0);
      const int64_t rows = ref::product(c.shapes[t], 1);
      used += numel;
      REQUIRE_EQ(layout.chunk % rows, 0);
      REQUIRE_EQ(layout.offsets[t] % rows, 0);
      REQUIRE(layout.offsets[t] >= 0);
      REQUIRE(layout.offsets[t] + numel <= layout.size);
      for (size_t u = 0; u < t; ++u) {
        const int64_t otherEnd = layout.offsets[u] + ref::product(c.shapes[u], 0);
        REQUIRE(layout.offsets[t] + numel <= layout.offsets[u] || otherEnd <= layout.offsets[t])
            << "tensors " << u << " and " << t << " overlap";
      }
    }
    REQUIRE_EQ(layout.size % (layout.chunk * ranks), 0);
    withHoles += used < layout.size;

    // Rank ranges: closed form, and shard index round trip.
    const std::vector<Range> ranges = rankRanges(layout.size, c.mesh, c.placements);
    REQUIRE_EQ(int64_t(ranges.size()), ranks);
    std::vector<std::vector<int64_t>> coordsOf(static_cast<size_t>(ranks));
    std::vector<int64_t> shardOf(static_cast<size_t>(ranks));
    for (int64_t rank = 0; rank < ranks; ++rank) {
      const std::vector<int64_t> &coords = coordsOf[rank] = rankCoords(rank, c.mesh);
      REQUIRE_EQ(ranges[rank], ref::rankRange(layout.size, coords, c.mesh, c.placements));
      int64_t pieces;
      const int64_t index = shardOf[rank] = ref::pieceIndex(coords, c.mesh, c.placements, pieces);
      REQUIRE_EQ(pieces, shards);
      REQUIRE_EQ(shardIndex(rank, c.mesh, c.placements), index);
      REQUIRE_EQ(
          localRange(layout.size, c.mesh, shardCoords(index, c.mesh, c.placements), c.placements),
          ranges[rank]);
    }

    // Pieces over the distinct shards, in buffer order: whole rows inside the
    // rank's range, tiling each tensor's rows; empty pieces report the rows
    // below the rank.
    const int64_t shardLength = layout.size / shards;
    for (size_t t = 0; t < c.shapes.size(); ++t) {
      const Shape &shape = c.shapes[t];
      const int64_t numel = ref::product(shape, 0);
      const int64_t rows = ref::product(shape, 1);
      const int64_t offset = layout.offsets[t];
      int64_t nextRow = 0;
      for (int64_t s = 0; s < shards; ++s) {
        const Range range{s * shardLength, (s + 1) * shardLength};
        const Piece piece = pieceOf(offset, shape, range);
        if (piece.empty()) {
          const int64_t below = std::min(std::max(range.begin - offset, int64_t(0)), numel);
          REQUIRE_EQ(piece.rowOffset * rows, below);
          REQUIRE_EQ(piece.localOffset, 0);
          continue;
        }
        REQUIRE_EQ(piece.rowOffset, nextRow);
        const int64_t begin = offset + piece.rowOffset * rows;
        const int64_t end = begin + piece.rows * rows;
        REQUIRE_EQ(begin, std::max(offset, range.begin));
        REQUIRE_EQ(end, std::min(offset + numel, range.end));
        REQUIRE_EQ(piece.localOffset, begin - range.begin);
        nextRow += piece.rows;
      }
      REQUIRE_EQ(nextRow, shape[0]) << "tensor " << t;
    }

    // Canonical Shard(0) comparison against the simulated DTensor split.
    for (size_t t = 0; t < c.shapes.size(); ++t) {
      const Shape &shape = c.shapes[t];
      bool differs = false;
      const std::vector<std::vector<int64_t>> canonicalByRank =
          ref::canonicalRowsByRank(shape[0], c.mesh, c.placements);
      REQUIRE_EQ(int64_t(canonicalByRank.size()), ranks);
      for (int64_t rank = 0; rank < ranks; ++rank) {
        const std::vector<int64_t> &coords = coordsOf[rank];
        const std::vector<int64_t> &canonical = canonicalByRank[rank];
        const Range canonicalRange = canonicalRowsForCoords(shape[0], c.mesh, coords, c.placements);
        REQUIRE_EQ(canonicalRange.size(), int64_t(canonical.size()));
        if (!canonical.empty()) {
          REQUIRE_EQ(canonicalRange.begin, canonical.front());
        }
        const Piece real = pieceOf(layout.offsets[t], shape, ranges[rank]);
        if (real.rows != int64_t(canonical.size()) ||
            (real.rows > 0 && real.rowOffset != canonical.front()))
          differs = true;
      }
      REQUIRE_EQ(differsFromCanonical(layout.offsets[t], shape, layout.size, c.mesh, c.placements),
                 differs)
          << "tensor " << t;
      differing += differs;
    }

    if (layout.size > kSimulateUpTo)
      continue;
    ++simulated;

    // Element-by-element: who owns each buffer element; then walk the
    // distinct shards in buffer order and record what each one holds.
    const size_t tensors = c.shapes.size();
    std::vector<int> owner(static_cast<size_t>(layout.size), -1);
    for (size_t t = 0; t < tensors; ++t)
      for (int64_t e = 0; e < ref::product(c.shapes[t], 0); ++e) {
        int &slot = owner[static_cast<size_t>(layout.offsets[t] + e)];
        if (slot != -1) // plain ifs in the hot loops keep -O0 builds fast
          FAIL() << "element " << layout.offsets[t] + e << " owned twice";
        slot = int(t);
      }
    std::vector<std::vector<Piece>> held(static_cast<size_t>(shards), std::vector<Piece>(tensors));
    std::vector<int64_t> seen(tensors, 0); // elements of t in earlier shards
    for (int64_t s = 0; s < shards; ++s) {
      const int64_t begin = s * shardLength, end = begin + shardLength;
      std::vector<int64_t> first(tensors, -1), count(tensors, 0);
      for (int64_t e = begin; e < end; ++e) {
        const int t = owner[static_cast<size_t>(e)];
        if (t < 0)
          continue;
        if (first[t] < 0)
          first[t] = e;
        if (e != first[t] + count[t])
          FAIL() << "piece of tensor " << t << " not contiguous";
        ++count[t];
      }
      for (size_t t = 0; t < tensors; ++t) {
        const int64_t rows = ref::product(c.shapes[t], 1);
        Piece &piece = held[s][t];
        if (count[t] == 0) {
          REQUIRE_EQ(seen[t] % rows, 0);
          piece.rowOffset = seen[t] / rows;
        } else {
          REQUIRE_EQ(first[t] - layout.offsets[t], seen[t]);
          REQUIRE_EQ(seen[t] % rows, 0) << "partial row";
          REQUIRE_EQ(count[t] % rows, 0) << "partial row";
          piece = Piece{seen[t] / rows, count[t] / rows, first[t] - begin};
        }
        seen[t] += count[t];
      }
    }
    for (size_t t = 0; t < tensors; ++t)
      REQUIRE_EQ(seen[t], ref::product(c.shapes[t], 0)) << "tensor " << t << " not tiled";
    for (int64_t rank = 0; rank < ranks; ++rank) {
      const int64_t s = shardOf[rank];
      for (size_t t = 0; t < tensors; ++t)
        REQUIRE_EQ(pieceOf(layout.offsets[t], c.shapes[t], ranges[rank]), held[s][t])
            << "rank " << rank << " tensor " << t;
    }
  }
  // The generator must exercise the interesting parts.
  EXPECT_GT(simulated, kCases / 2);
  EXPECT_GT(withHoles, kCases / 2);
  EXPECT_GT(differing, kCases / 10);
}

TEST(LayoutProperty, VerifyRejectsExactlyTheBrokenLayouts) {
  std::mt19937_64 rng(0xbadc0ffeu);
  int rejected = 0, accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const RandomCase c = randomCase(rng);
    SCOPED_TRACE("case " + std::to_string(iter) + ": " + describe(c));
    const int64_t ranks = meshSize(c.mesh);
    PackedLayout layout = ref::pack(c.shapes, ranks);
    auto uniform = [&](int64_t lo, int64_t hi) {
      return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    // One random corruption (sometimes a harmless one).
    switch (uniform(0, 3)) {
    case 0:
    case 1: {
      const size_t t = static_cast<size_t>(uniform(0, int64_t(c.shapes.size()) - 1));
      layout.offsets[t] += uniform(-layout.chunk, layout.chunk);
      break;
    }
    case 2:
      layout.size += uniform(-1, 1) * layout.chunk * uniform(0, 2);
      break;
    default:
      layout.chunk *= uniform(1, 3);
      break;
    }

    // Plain restatement of the invariants.
    bool valid = layout.size >= 0 && layout.size % (layout.chunk * ranks) == 0;
    for (size_t t = 0; t < c.shapes.size(); ++t) {
      const int64_t numel = ref::product(c.shapes[t], 0);
      const int64_t rows = ref::product(c.shapes[t], 1);
      const int64_t off = layout.offsets[t];
      valid = valid && layout.chunk % rows == 0 && off >= 0 && off % rows == 0 &&
              off + numel <= layout.size;
      for (size_t u = 0; u < t; ++u) {
        const int64_t uOff = layout.offsets[u];
        const int64_t uEnd = uOff + ref::product(c.shapes[u], 0);
        valid = valid && (off + numel <= uOff || uEnd <= off);
      }
    }
    fsdp::Status status = verifyLayout(c.shapes, layout, c.mesh, c.placements);
    ASSERT_EQ(status.ok(), valid) << (status.ok() ? "accepted" : status.error());
    if (!status.ok()) {
      ASSERT_FALSE(status.error().empty());
      ASSERT_EQ(status.error().find('\n'), std::string::npos);
    }
    (valid ? accepted : rejected)++;
  }
  EXPECT_GT(rejected, 500);
  EXPECT_GT(accepted, 500);
}

} // namespace

// shardIndices (one pass over every rank) agrees with shardIndex rank by rank
// on every mesh of up to three axes with sizes 1-4 and every valid placement.
TEST(LayoutMesh, ShardIndicesMatchShardIndex) {
  int meshes = 0;
  for (int axes = 1; axes <= 3; ++axes) {
    for (int code = 0; code < (1 << (2 * axes)); ++code) {
      std::vector<int64_t> sizes;
      for (int axis = 0; axis < axes; ++axis)
        sizes.push_back(1 + ((code >> (2 * axis)) & 3));
      for (int numShard = 1; numShard <= axes; ++numShard) {
        std::vector<Placement> placements(axes - numShard, Placement::Replicate);
        placements.resize(axes, Placement::Shard);
        std::vector<int64_t> indices = shardIndices(sizes, placements);
        ASSERT_EQ(static_cast<int64_t>(indices.size()), meshSize(sizes));
        for (int64_t rank = 0; rank < meshSize(sizes); ++rank)
          ASSERT_EQ(indices[rank], shardIndex(rank, sizes, placements))
              << "rank " << rank << " of a " << axes << "-axis mesh";
        ++meshes;
      }
    }
  }
  EXPECT_EQ(meshes, 4 * 1 + 16 * 2 + 64 * 3);
}

// Expert meshes (docs/Experts.md): world dp=8 as (edp=2, ep=4); expert
// groups are runs of consecutive ranks, as Megatron-Core orders them.
TEST(ExpertMesh, ViewsTheWorldRowMajorWithTheExpertAxisDropped) {
  fsdp::layout::ExpertMesh mesh{{2, 4}, 1};
  ASSERT_TRUE(fsdp::layout::checkExpertMesh(mesh, 8));
  EXPECT_EQ(mesh.meshSizes(), (std::vector<int64_t>{2}));
  EXPECT_EQ(mesh.expertGroups(), 4);
  for (int64_t rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(mesh.expertCoord(rank), rank % 4);
    EXPECT_EQ(mesh.meshRank(rank), rank / 4);
    EXPECT_EQ(mesh.worldRank(mesh.meshRank(rank), mesh.expertCoord(rank)), rank);
  }
  // HSDP of experts: (erep=2, edp=2, ep=2), the expert axis in the middle too.
  fsdp::layout::ExpertMesh middle{{2, 2, 2}, 1};
  EXPECT_EQ(middle.meshSizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(middle.expertCoord(2), 1);
  EXPECT_EQ(middle.meshRank(2), 0);
  EXPECT_EQ(middle.meshRank(5), 3);
  EXPECT_EQ(fsdp::layout::globalExpert(1, 3, 2), 7);
}

TEST(ExpertMesh, RefusesViewsThatDoNotFillTheWorld) {
  EXPECT_FALSE(fsdp::layout::checkExpertMesh({{3, 2}, 1}, 8));
  EXPECT_FALSE(fsdp::layout::checkExpertMesh({{2, 4}, 2}, 8));
  EXPECT_FALSE(fsdp::layout::checkExpertMesh({{2, 0}, 0}, 8));
  EXPECT_FALSE(fsdp::layout::checkExpertMesh({{int64_t(1) << 40, 4}, 1}, 8));
  fsdp::Status status = fsdp::layout::checkExpertMesh({{3, 2}, 1}, 8);
  EXPECT_NE(status.error().find("multiply out to 6 ranks but the world mesh has 8"),
            std::string::npos)
      << status.error();
}

TEST(ExpertNames, SplitAroundTheLocalNumber) {
  using fsdp::layout::ExpertNaming;
  using fsdp::layout::splitExpertFQN;
  auto grouped = splitExpertFQN("layers.0.mlp.experts.linear_fc1.weight12",
                                "layers.0.mlp.experts", ExpertNaming::Grouped);
  ASSERT_TRUE(grouped);
  EXPECT_EQ(grouped->head, "layers.0.mlp.experts.linear_fc1.weight");
  EXPECT_EQ(grouped->local, 12);
  EXPECT_EQ(grouped->withNumber(40), "layers.0.mlp.experts.linear_fc1.weight40");
  auto local = splitExpertFQN("moe.experts.local_experts.3.linear_fc2.bias", "moe.experts",
                              ExpertNaming::LocalExperts);
  ASSERT_TRUE(local);
  EXPECT_EQ(local->local, 3);
  EXPECT_EQ(local->withNumber(7), "moe.experts.local_experts.7.linear_fc2.bias");
  // The root unit, and names that do not follow the rule.
  EXPECT_TRUE(splitExpertFQN("weight0", "", ExpertNaming::Grouped));
  EXPECT_FALSE(splitExpertFQN("experts.weight03", "experts", ExpertNaming::Grouped));
  EXPECT_FALSE(splitExpertFQN("experts.weight", "experts", ExpertNaming::Grouped));
  EXPECT_FALSE(splitExpertFQN("experts.7", "experts", ExpertNaming::Grouped)); // no stem
  EXPECT_FALSE(splitExpertFQN("other.weight0", "experts", ExpertNaming::Grouped));
  EXPECT_FALSE(splitExpertFQN("e.local_experts.01.w", "e", ExpertNaming::LocalExperts));
  EXPECT_FALSE(splitExpertFQN("e.local_experts.x1.w", "e", ExpertNaming::LocalExperts));
  EXPECT_FALSE(splitExpertFQN("e.local_experts.1", "e", ExpertNaming::LocalExperts));
  EXPECT_FALSE(splitExpertFQN("e.local_experts.1.", "e", ExpertNaming::LocalExperts));
  EXPECT_FALSE(splitExpertFQN("e.experts.1.w", "e", ExpertNaming::LocalExperts));
  EXPECT_FALSE(fsdp::layout::trailingExpertNumber("w1234567890123456789")); // 19 digits
}
