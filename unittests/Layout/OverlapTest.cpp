//===- OverlapTest.cpp - Chunk overlap and coverage -----------------------===//
//
// Fixed cases plus randomized comparisons against brute force: every element
// of a small global tensor is mapped through both boxes one by one.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Layout/Overlap.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace fsdp::layout;

namespace {

std::vector<CopyRun> runsOf(const Box &src, const Box &dst) {
  std::vector<CopyRun> runs;
  overlapRuns(src, dst, runs);
  return runs;
}

/// A row-range chunk [row, row + rows) of a global tensor of `shape`.
Box rowRange(const std::vector<int64_t> &shape, int64_t row, int64_t rows) {
  Box box{std::vector<int64_t>(shape.size(), 0), shape};
  box.offsets[0] = row;
  box.sizes[0] = rows;
  return box;
}

//===----------------------------------------------------------------------===//
// Fixed cases
//===----------------------------------------------------------------------===//

TEST(Intersect, Basics) {
  Box a{{0, 0}, {4, 6}}, b{{2, 3}, {5, 5}};
  std::optional<Box> common = intersect(a, b);
  ASSERT_TRUE(common.has_value());
  EXPECT_EQ(*common, (Box{{2, 3}, {2, 3}}));
  EXPECT_FALSE(intersect(a, Box{{4, 0}, {1, 6}}).has_value()); // touching
  EXPECT_FALSE(intersect(a, Box{{0}, {4}}).has_value());       // other rank
  EXPECT_EQ(intersect(Box{}, Box{}), Box{});                   // scalars
  EXPECT_EQ(boxElements(Box{}), 1);
  EXPECT_EQ(boxElements(Box{{0, 0}, {3, 0}}), 0);
}

TEST(OverlapRuns, RowRangesAreOneRun) {
  // The worked example's P0 [5,3]: saved on 4 ranks as rows [0,4) and [4,5);
  // a target split 2/2/1 reads rows [2,4) from the first saved chunk and
  // [4,5) from the second.
  const std::vector<int64_t> shape = {5, 3};
  EXPECT_EQ(runsOf(rowRange(shape, 0, 4), rowRange(shape, 2, 2)),
            (std::vector<CopyRun>{{6, 0, 6}}));
  EXPECT_EQ(runsOf(rowRange(shape, 4, 1), rowRange(shape, 4, 1)),
            (std::vector<CopyRun>{{0, 0, 3}}));
  EXPECT_TRUE(runsOf(rowRange(shape, 0, 4), rowRange(shape, 4, 1)).empty());
  // 1-D.
  EXPECT_EQ(runsOf(Box{{3}, {10}}, Box{{0}, {7}}), (std::vector<CopyRun>{{0, 3, 4}}));
  // Scalar.
  EXPECT_EQ(runsOf(Box{}, Box{}), (std::vector<CopyRun>{{0, 0, 1}}));
}

TEST(OverlapRuns, ColumnSplitNeedsOneRunPerRow) {
  // Saved as Shard(1) halves of a [3,4] tensor; target is the full tensor.
  Box left{{0, 0}, {3, 2}}, right{{0, 2}, {3, 2}}, full{{0, 0}, {3, 4}};
  EXPECT_EQ(runsOf(left, full), (std::vector<CopyRun>{{0, 0, 2}, {2, 4, 2}, {4, 8, 2}}));
  EXPECT_EQ(runsOf(right, full), (std::vector<CopyRun>{{0, 2, 2}, {2, 6, 2}, {4, 10, 2}}));
  // Appends rather than replaces.
  std::vector<CopyRun> runs = {{9, 9, 9}};
  overlapRuns(left, full, runs);
  EXPECT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs.front(), (CopyRun{9, 9, 9}));
}

TEST(OverlapRuns, FullTrailingDimsMerge) {
  // [2,3,4] boxes that differ only in dim 1: dims 2 merge, dim 1 does not.
  Box src{{0, 0, 0}, {2, 3, 4}}, dst{{0, 1, 0}, {2, 2, 4}};
  EXPECT_EQ(runsOf(src, dst), (std::vector<CopyRun>{{4, 0, 8}, {16, 8, 8}}));
}

TEST(Covers, Fixed) {
  const std::vector<int64_t> shape = {5, 3};
  Box target = rowRange(shape, 0, 5);
  EXPECT_TRUE(covers({rowRange(shape, 0, 4), rowRange(shape, 4, 1)}, target));
  EXPECT_FALSE(covers({rowRange(shape, 0, 3), rowRange(shape, 4, 1)}, target)); // row 3
  EXPECT_TRUE(covers({rowRange(shape, 0, 4), rowRange(shape, 2, 3)}, target));  // overlap ok
  EXPECT_FALSE(covers({}, target));
  EXPECT_TRUE(covers({}, Box{{0, 0}, {0, 3}})); // empty target
  // Column halves cover; one half alone does not.
  Box full{{0, 0}, {3, 4}};
  EXPECT_TRUE(covers({Box{{0, 0}, {3, 2}}, Box{{0, 2}, {3, 2}}}, full));
  EXPECT_FALSE(covers({Box{{0, 0}, {3, 2}}}, full));
  // An L shape misses one corner element.
  EXPECT_FALSE(covers({Box{{0, 0}, {2, 4}}, Box{{2, 0}, {1, 3}}}, full));
  EXPECT_TRUE(covers({Box{{0, 0}, {2, 4}}, Box{{2, 0}, {1, 3}}, Box{{1, 3}, {2, 1}}}, full));
  // Scalars; boxes of another rank are ignored.
  EXPECT_TRUE(covers({Box{}}, Box{}));
  EXPECT_FALSE(covers({Box{{0}, {15}}}, full));
}

//===----------------------------------------------------------------------===//
// Randomized against brute force
//===----------------------------------------------------------------------===//

struct Rng {
  std::mt19937_64 engine;
  explicit Rng(uint64_t seed) : engine(seed) {}
  int64_t operator()(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine);
  }
};

std::vector<int64_t> randomShape(Rng &rng) {
  std::vector<int64_t> shape(static_cast<size_t>(rng(0, 4)));
  for (int64_t &dim : shape)
    dim = rng(1, 6);
  return shape;
}

/// A random non-empty box inside `shape`; a row range about a third of the
/// time (full in every dim but 0).
Box randomBox(Rng &rng, const std::vector<int64_t> &shape) {
  Box box{std::vector<int64_t>(shape.size()), std::vector<int64_t>(shape.size())};
  const bool rows = rng(0, 2) == 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (rows && d > 0) {
      box.offsets[d] = 0;
      box.sizes[d] = shape[d];
      continue;
    }
    box.offsets[d] = rng(0, shape[d] - 1);
    box.sizes[d] = rng(1, shape[d] - box.offsets[d]);
  }
  return box;
}

bool inside(const Box &box, const std::vector<int64_t> &point) {
  for (size_t d = 0; d < point.size(); ++d)
    if (point[d] < box.offsets[d] || point[d] >= box.offsets[d] + box.sizes[d])
      return false;
  return true;
}

int64_t offsetIn(const Box &box, const std::vector<int64_t> &point) {
  int64_t offset = 0;
  for (size_t d = 0; d < point.size(); ++d)
    offset = offset * box.sizes[d] + (point[d] - box.offsets[d]);
  return offset;
}

/// Every point of `shape`, row-major.
std::vector<std::vector<int64_t>> allPoints(const std::vector<int64_t> &shape) {
  std::vector<std::vector<int64_t>> points;
  std::vector<int64_t> point(shape.size(), 0);
  while (true) {
    points.push_back(point);
    size_t d = shape.size();
    while (d-- > 0) {
      if (++point[d] < shape[d])
        break;
      point[d] = 0;
    }
    if (d == static_cast<size_t>(-1))
      return points;
  }
}

TEST(OverlapProperty, RunsMatchBruteForce) {
  Rng rng(0x0e71a9u);
  int rowRangePairs = 0, multiRun = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    const std::vector<int64_t> shape = randomShape(rng);
    const Box src = randomBox(rng, shape), dst = randomBox(rng, shape);
    SCOPED_TRACE("case " + std::to_string(iter));

    // Brute force: the (src, dst) storage offsets of the overlap, row-major.
    std::vector<std::pair<int64_t, int64_t>> expected;
    for (const std::vector<int64_t> &point : allPoints(shape))
      if (inside(src, point) && inside(dst, point))
        expected.emplace_back(offsetIn(src, point), offsetIn(dst, point));
    int64_t minimalRuns = expected.empty() ? 0 : 1;
    for (size_t i = 1; i < expected.size(); ++i)
      minimalRuns += expected[i].first != expected[i - 1].first + 1 ||
                     expected[i].second != expected[i - 1].second + 1;

    std::vector<CopyRun> runs = runsOf(src, dst);
    std::vector<std::pair<int64_t, int64_t>> actual;
    for (const CopyRun &run : runs) {
      ASSERT_GT(run.count, 0);
      for (int64_t k = 0; k < run.count; ++k)
        actual.emplace_back(run.srcElementOffset + k, run.dstElementOffset + k);
    }
    ASSERT_EQ(actual, expected);
    ASSERT_EQ(int64_t(runs.size()), minimalRuns);
    ASSERT_EQ(intersect(src, dst).has_value(), !expected.empty());

    bool bothRowRanges = true;
    for (size_t d = 1; d < shape.size(); ++d)
      bothRowRanges = bothRowRanges && src.sizes[d] == shape[d] && dst.sizes[d] == shape[d];
    if (bothRowRanges && !expected.empty()) {
      ASSERT_EQ(runs.size(), 1u);
      ++rowRangePairs;
    }
    multiRun += runs.size() > 1;
  }
  EXPECT_GT(rowRangePairs, 300);
  EXPECT_GT(multiRun, 300);
}

TEST(OverlapProperty, CoversMatchesBruteForce) {
  Rng rng(0xc07e75u);
  int coveredCases = 0, uncoveredCases = 0;
  for (int iter = 0; iter < 5000; ++iter) {
    const std::vector<int64_t> shape = randomShape(rng);
    SCOPED_TRACE("case " + std::to_string(iter));
    const Box target = randomBox(rng, shape);
    std::vector<Box> saved;
    const int64_t kind = rng(0, 2);
    if (kind == 0 && !shape.empty()) {
      // A row-range tiling of the whole tensor, sometimes with one piece
      // dropped or cut short: the packed-layout case.
      int64_t row = 0;
      while (row < shape[0]) {
        const int64_t rows = rng(1, shape[0] - row);
        saved.push_back(rowRange(shape, row, rows));
        row += rows;
      }
      if (rng(0, 1) == 0)
        saved.erase(saved.begin() + rng(0, int64_t(saved.size()) - 1));
      if (!saved.empty() && rng(0, 3) == 0 && saved.back().sizes[0] > 1)
        --saved.back().sizes[0];
    } else if (kind == 1) {
      // A grid tiling (every dim split), with a piece dropped half the time.
      std::vector<std::vector<int64_t>> cuts(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        cuts[d].push_back(0);
        while (cuts[d].back() < shape[d])
          cuts[d].push_back(cuts[d].back() + rng(1, shape[d] - cuts[d].back()));
      }
      std::vector<int64_t> cells(shape.size());
      for (size_t d = 0; d < shape.size(); ++d)
        cells[d] = int64_t(cuts[d].size()) - 1;
      for (const std::vector<int64_t> &cell : allPoints(cells)) {
        Box box{std::vector<int64_t>(shape.size()), std::vector<int64_t>(shape.size())};
        for (size_t d = 0; d < shape.size(); ++d) {
          box.offsets[d] = cuts[d][cell[d]];
          box.sizes[d] = cuts[d][cell[d] + 1] - cuts[d][cell[d]];
        }
        saved.push_back(box);
      }
      if (rng(0, 1) == 0)
        saved.erase(saved.begin() + rng(0, int64_t(saved.size()) - 1));
    } else {
      // Random overlapping boxes.
      const int64_t count = rng(0, 6);
      for (int64_t i = 0; i < count; ++i)
        saved.push_back(randomBox(rng, shape));
    }

    bool expected = true;
    for (const std::vector<int64_t> &point : allPoints(shape)) {
      if (!inside(target, point))
        continue;
      bool hit = false;
      for (const Box &box : saved)
        hit = hit || inside(box, point);
      expected = expected && hit;
    }
    ASSERT_EQ(covers(saved, target), expected);
    (expected ? coveredCases : uncoveredCases)++;
  }
  EXPECT_GT(coveredCases, 1000);
  EXPECT_GT(uncoveredCases, 1000);
}

} // namespace
