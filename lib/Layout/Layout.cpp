//===- Layout.cpp - Megatron-FSDP v2 packed-buffer layout math ------------===//

#include "fsdp/Layout/Layout.h"

#include <algorithm>
#include <cassert>
#include <numeric>
#include <string>

namespace fsdp {
namespace layout {

namespace {

//===----------------------------------------------------------------------===//
// Overflow-checked int64_t arithmetic (false on overflow).
//===----------------------------------------------------------------------===//

bool checkedAdd(int64_t a, int64_t b, int64_t &out) {
  return !__builtin_add_overflow(a, b, &out);
}

bool checkedMul(int64_t a, int64_t b, int64_t &out) {
  return !__builtin_mul_overflow(a, b, &out);
}

/// Smallest multiple of `multiple` (> 0) that is >= value (>= 0).
bool checkedRoundUp(int64_t value, int64_t multiple, int64_t &out) {
  int64_t remainder = value % multiple;
  if (remainder == 0) {
    out = value;
    return true;
  }
  return checkedAdd(value, multiple - remainder, out);
}

bool checkedLcm(int64_t a, int64_t b, int64_t &out) {
  return checkedMul(a / std::gcd(a, b), b, out);
}

std::string shapeString(const Shape &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      text += ",";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::string rangeString(Range range) {
  return "[" + std::to_string(range.begin) + ", " + std::to_string(range.end) + ")";
}

Error overflowError(const std::string &what) {
  return makeError("layout overflow: " + what + " does not fit in 64 bits");
}

} // namespace

//===----------------------------------------------------------------------===//
// Shapes
//===----------------------------------------------------------------------===//

int64_t numElements(const Shape &shape) {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

int64_t rowSize(const Shape &shape) {
  int64_t count = 1;
  for (size_t i = 1; i < shape.size(); ++i)
    count *= shape[i];
  return count;
}

Status checkShape(const Shape &shape) {
  if (shape.empty())
    return makeError("rank-0 (scalar) tensors cannot be packed into a flat buffer");
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1)
      return makeError("shape " + shapeString(shape) + " has dim " +
                       std::to_string(i) + " = " + std::to_string(shape[i]) +
                       "; every dim must be >= 1");
    if (!checkedMul(count, shape[i], count))
      return overflowError("element count of shape " + shapeString(shape));
  }
  return Status::success();
}

Result<int64_t> checkedNumElements(const Shape &shape) {
  Status status = checkShape(shape);
  if (!status)
    return makeError(status.error());
  return numElements(shape);
}

//===----------------------------------------------------------------------===//
// Packing
//===----------------------------------------------------------------------===//

Result<PackedLayout> packGroup(const std::vector<Shape> &shapes, int64_t dpSize) {
  if (dpSize < 1)
    return makeError("data-parallel size must be >= 1, got " + std::to_string(dpSize));

  struct Item {
    size_t index;
    int64_t numel;
    int64_t rowSize;
  };

  PackedLayout layout;
  layout.chunk = 1;
  std::vector<Item> items;
  items.reserve(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    Status status = checkShape(shapes[i]);
    if (!status)
      return makeError("tensor " + std::to_string(i) + ": " + status.error());
    Item item{i, numElements(shapes[i]), rowSize(shapes[i])};
    if (!checkedLcm(layout.chunk, item.rowSize, layout.chunk))
      return overflowError("chunk (lcm of row sizes)");
    items.push_back(item);
  }
  const int64_t chunk = layout.chunk;

  // Regular tensors anchor the layout in group order; fragments wait for holes.
  std::vector<Item> regular, fragments;
  for (const Item &item : items)
    (item.numel >= chunk ? regular : fragments).push_back(item);
  std::stable_sort(fragments.begin(), fragments.end(),
                   [](const Item &a, const Item &b) { return a.numel > b.numel; });

  layout.offsets.assign(shapes.size(), -1);
  std::vector<bool> regularTaken(regular.size(), false);
  int64_t next = 0;
  for (size_t r = 0; r < regular.size(); ++r) {
    if (regularTaken[r])
      continue;
    const Item &tensor = regular[r];
    regularTaken[r] = true;
    layout.offsets[tensor.index] = next;
    const int64_t remainder = tensor.numel % chunk;
    if (remainder == 0) {
      if (!checkedAdd(next, tensor.numel, next))
        return overflowError("buffer size");
      continue;
    }

    // The hole [holeBegin, holeEnd) pads the tensor to a chunk boundary.
    int64_t paddedNumel, paddedEnd;
    if (!checkedRoundUp(tensor.numel, chunk, paddedNumel) ||
        !checkedAdd(next, paddedNumel, paddedEnd))
      return overflowError("buffer size");
    int64_t holeBegin = next + tensor.numel;
    next = paddedEnd;
    int64_t holeEnd = next;

    // The first later regular tensor whose remainder fits in this chunk's hole
    // starts inside the hole so that its remainder ends on the chunk boundary.
    for (size_t c = r + 1; c < regular.size(); ++c) {
      if (regularTaken[c])
        continue;
      const int64_t conjugateRemainder = regular[c].numel % chunk;
      if (conjugateRemainder == 0 || remainder + conjugateRemainder > chunk)
        continue;
      regularTaken[c] = true;
      const int64_t conjugateOffset = next - conjugateRemainder;
      layout.offsets[regular[c].index] = conjugateOffset;
      holeEnd = conjugateOffset;
      if (!checkedAdd(next, regular[c].numel - conjugateRemainder, next))
        return overflowError("buffer size");
      break;
    }

    // Fill what is left of the hole with fragments, each at an offset aligned
    // to its own row size so no rank ever owns part of a row.
    size_t kept = 0;
    for (size_t f = 0; f < fragments.size(); ++f) {
      const Item &fragment = fragments[f];
      int64_t aligned, fragmentEnd;
      if (checkedRoundUp(holeBegin, fragment.rowSize, aligned) &&
          checkedAdd(aligned, fragment.numel, fragmentEnd) && fragmentEnd <= holeEnd) {
        layout.offsets[fragment.index] = aligned;
        holeBegin = aligned + fragment.numel;
      } else {
        fragments[kept++] = fragment;
      }
    }
    fragments.resize(kept);
  }

  // Fragments that found no hole go to the tail, row-aligned.
  for (const Item &fragment : fragments) {
    if (!checkedRoundUp(next, fragment.rowSize, next))
      return overflowError("buffer size");
    layout.offsets[fragment.index] = next;
    if (!checkedAdd(next, fragment.numel, next))
      return overflowError("buffer size");
  }

  int64_t granule;
  if (!checkedMul(chunk, dpSize, granule))
    return overflowError("chunk * data-parallel size");
  if (!checkedRoundUp(next, granule, layout.size))
    return overflowError("padded buffer size");
  return layout;
}

//===----------------------------------------------------------------------===//
// Mesh
//===----------------------------------------------------------------------===//

bool Range::operator==(const Range &other) const {
  return begin == other.begin && end == other.end;
}

Status checkPlacements(const std::vector<int64_t> &meshSizes,
                       const std::vector<Placement> &placements) {
  if (placements.size() != meshSizes.size())
    return makeError("mesh has " + std::to_string(meshSizes.size()) +
                     " axes but " + std::to_string(placements.size()) +
                     " placements were given");
  int64_t ranks = 1;
  for (size_t axis = 0; axis < meshSizes.size(); ++axis) {
    if (meshSizes[axis] < 1)
      return makeError("mesh axis " + std::to_string(axis) + " has size " +
                       std::to_string(meshSizes[axis]) + "; sizes must be >= 1");
    if (!checkedMul(ranks, meshSizes[axis], ranks))
      return overflowError("mesh rank count");
  }
  // Shard axes must be a suffix so every rank's piece is one contiguous range.
  for (size_t axis = 0; axis + 1 < placements.size(); ++axis)
    if (placements[axis] == Placement::Shard &&
        placements[axis + 1] == Placement::Replicate)
      return makeError("placement of mesh axis " + std::to_string(axis) +
                       " is shard but axis " + std::to_string(axis + 1) +
                       " is replicate; shard axes must form a suffix");
  return Status::success();
}

int64_t meshSize(const std::vector<int64_t> &meshSizes) {
  int64_t ranks = 1;
  for (int64_t size : meshSizes)
    ranks *= size;
  return ranks;
}

int64_t flatRank(const std::vector<int64_t> &coords,
                 const std::vector<int64_t> &meshSizes) {
  assert(coords.size() == meshSizes.size());
  int64_t rank = 0;
  for (size_t axis = 0; axis < meshSizes.size() && axis < coords.size(); ++axis)
    rank = rank * meshSizes[axis] + coords[axis];
  return rank;
}

std::vector<int64_t> rankCoords(int64_t flatRank,
                                const std::vector<int64_t> &meshSizes) {
  std::vector<int64_t> coords(meshSizes.size(), 0);
  for (size_t axis = meshSizes.size(); axis-- > 0;) {
    coords[axis] = flatRank % meshSizes[axis];
    flatRank /= meshSizes[axis];
  }
  return coords;
}

Range localRange(int64_t bufferSize, const std::vector<int64_t> &meshSizes,
                 const std::vector<int64_t> &coords,
                 const std::vector<Placement> &placements) {
  assert(meshSizes.size() == coords.size() && meshSizes.size() == placements.size());
  if (meshSizes.size() != coords.size() || meshSizes.size() != placements.size())
    return Range{};
  int64_t begin = 0;
  int64_t length = bufferSize;
  // The last axis is the coarsest split: walk from it towards axis 0.
  for (size_t axis = meshSizes.size(); axis-- > 0;) {
    if (placements[axis] != Placement::Shard)
      continue;
    length /= meshSizes[axis];
    begin += coords[axis] * length;
  }
  return Range{begin, begin + length};
}

std::vector<Range> rankRanges(int64_t bufferSize,
                              const std::vector<int64_t> &meshSizes,
                              const std::vector<Placement> &placements) {
  const int64_t ranks = meshSize(meshSizes);
  std::vector<Range> ranges;
  ranges.reserve(static_cast<size_t>(ranks));
  std::vector<int64_t> coords(meshSizes.size(), 0);
  for (int64_t rank = 0; rank < ranks; ++rank) {
    ranges.push_back(localRange(bufferSize, meshSizes, coords, placements));
    // Advance the row-major odometer (last axis fastest).
    for (size_t axis = coords.size(); axis-- > 0;) {
      if (++coords[axis] < meshSizes[axis])
        break;
      coords[axis] = 0;
    }
  }
  return ranges;
}

int64_t numShards(const std::vector<int64_t> &meshSizes,
                  const std::vector<Placement> &placements) {
  int64_t shards = 1;
  for (size_t axis = 0; axis < meshSizes.size() && axis < placements.size(); ++axis)
    if (placements[axis] == Placement::Shard)
      shards *= meshSizes[axis];
  return shards;
}

int64_t shardIndex(int64_t flatRank, const std::vector<int64_t> &meshSizes,
                   const std::vector<Placement> &placements) {
  const std::vector<int64_t> coords = rankCoords(flatRank, meshSizes);
  // The first shard axis is the finest split, so it varies fastest in
  // buffer order.
  int64_t index = 0;
  int64_t stride = 1;
  for (size_t axis = 0; axis < meshSizes.size() && axis < placements.size(); ++axis) {
    if (placements[axis] != Placement::Shard)
      continue;
    index += coords[axis] * stride;
    stride *= meshSizes[axis];
  }
  return index;
}

std::vector<int64_t> shardIndices(const std::vector<int64_t> &meshSizes,
                                  const std::vector<Placement> &placements) {
  const int64_t ranks = meshSize(meshSizes);
  // Stride of each axis in shard-index order: the first shard axis varies
  // fastest (see shardIndex); replicate axes contribute nothing.
  std::vector<int64_t> strides(meshSizes.size(), 0);
  int64_t stride = 1;
  for (size_t axis = 0; axis < meshSizes.size() && axis < placements.size(); ++axis)
    if (placements[axis] == Placement::Shard) {
      strides[axis] = stride;
      stride *= meshSizes[axis];
    }
  std::vector<int64_t> indices;
  indices.reserve(static_cast<size_t>(ranks));
  std::vector<int64_t> coords(meshSizes.size(), 0);
  int64_t index = 0;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    indices.push_back(index);
    // Advance the row-major odometer (last axis fastest), keeping index in step.
    for (size_t axis = coords.size(); axis-- > 0;) {
      if (++coords[axis] < meshSizes[axis]) {
        index += strides[axis];
        break;
      }
      index -= strides[axis] * (meshSizes[axis] - 1);
      coords[axis] = 0;
    }
  }
  return indices;
}

namespace {
/// shardCoords into a caller-owned vector (loops over shards reuse it).
void decodeShardIndex(int64_t shardIndex, const std::vector<int64_t> &meshSizes,
                      const std::vector<Placement> &placements,
                      std::vector<int64_t> &coords) {
  coords.assign(meshSizes.size(), 0);
  for (size_t axis = 0; axis < meshSizes.size() && axis < placements.size(); ++axis) {
    if (placements[axis] != Placement::Shard)
      continue;
    coords[axis] = shardIndex % meshSizes[axis];
    shardIndex /= meshSizes[axis];
  }
}
} // namespace

std::vector<int64_t> shardCoords(int64_t shardIndex,
                                 const std::vector<int64_t> &meshSizes,
                                 const std::vector<Placement> &placements) {
  std::vector<int64_t> coords;
  decodeShardIndex(shardIndex, meshSizes, placements, coords);
  return coords;
}

//===----------------------------------------------------------------------===//
// Pieces
//===----------------------------------------------------------------------===//

Range overlapElements(int64_t tensorOffset, int64_t numel, Range rankRange) {
  const int64_t lo = std::max(tensorOffset, rankRange.begin);
  const int64_t hi = std::min(tensorOffset + numel, rankRange.end);
  if (lo >= hi) {
    // Empty: report it where the rank starts, clamped into the tensor.
    const int64_t at = std::clamp(rankRange.begin, tensorOffset, tensorOffset + numel);
    return Range{at, at};
  }
  return Range{lo, hi};
}

Piece pieceOf(int64_t tensorOffset, const Shape &shape, Range rankRange) {
  const int64_t rows = rowSize(shape);
  const Range overlap = overlapElements(tensorOffset, numElements(shape), rankRange);
  Piece piece;
  // For an empty piece overlap.begin is clamp(rank.begin, off, off+numel):
  // the rows that lower ranks own, as Megatron-FSDP reports it.
  piece.rowOffset = (overlap.begin - tensorOffset) / rows;
  if (overlap.size() == 0)
    return piece;
  piece.rows = overlap.size() / rows;
  piece.localOffset = overlap.begin - rankRange.begin;
  return piece;
}

//===----------------------------------------------------------------------===//
// Verification
//===----------------------------------------------------------------------===//

Status verifyLayout(const std::vector<Shape> &shapes, const PackedLayout &layout,
                    const std::vector<int64_t> &meshSizes,
                    const std::vector<Placement> &placements) {
  Status meshStatus = checkPlacements(meshSizes, placements);
  if (!meshStatus)
    return meshStatus;
  if (layout.offsets.size() != shapes.size())
    return makeError("layout has " + std::to_string(layout.offsets.size()) +
                     " offsets for " + std::to_string(shapes.size()) + " tensors");
  if (layout.chunk < 1)
    return makeError("layout chunk must be >= 1, got " + std::to_string(layout.chunk));
  if (layout.size < 0)
    return makeError("layout size must be >= 0, got " + std::to_string(layout.size));

  const int64_t ranks = meshSize(meshSizes);
  int64_t granule;
  if (!checkedMul(layout.chunk, ranks, granule))
    return overflowError("chunk * mesh size");
  if (layout.size % granule != 0)
    return makeError("layout size " + std::to_string(layout.size) +
                     " is not a multiple of chunk * mesh size = " +
                     std::to_string(layout.chunk) + " * " + std::to_string(ranks));

  struct Extent {
    int64_t begin, end;
    size_t tensor;
  };
  std::vector<Extent> extents;
  extents.reserve(shapes.size());
  for (size_t t = 0; t < shapes.size(); ++t) {
    const std::string name = "tensor " + std::to_string(t);
    Status shapeStatus = checkShape(shapes[t]);
    if (!shapeStatus)
      return makeError(name + ": " + shapeStatus.error());
    const int64_t rows = rowSize(shapes[t]);
    const int64_t numel = numElements(shapes[t]);
    const int64_t offset = layout.offsets[t];
    if (layout.chunk % rows != 0)
      return makeError(name + ": chunk " + std::to_string(layout.chunk) +
                       " is not a multiple of its row size " + std::to_string(rows));
    if (offset < 0)
      return makeError(name + ": offset " + std::to_string(offset) + " is negative");
    if (offset % rows != 0)
      return makeError(name + ": offset " + std::to_string(offset) +
                       " is not a multiple of its row size " + std::to_string(rows));
    int64_t end;
    if (!checkedAdd(offset, numel, end) || end > layout.size)
      return makeError(name + ": its " + std::to_string(numel) +
                       " elements at offset " + std::to_string(offset) +
                       " run past the buffer size " + std::to_string(layout.size));
    extents.push_back(Extent{offset, end, t});
  }

  std::sort(extents.begin(), extents.end(), [](const Extent &a, const Extent &b) {
    return a.begin != b.begin ? a.begin < b.begin : a.tensor < b.tensor;
  });
  for (size_t i = 1; i < extents.size(); ++i)
    if (extents[i].begin < extents[i - 1].end)
      return makeError("tensor " + std::to_string(extents[i].tensor) + " at " +
                       rangeString(Range{extents[i].begin, extents[i].end}) +
                       " overlaps tensor " + std::to_string(extents[i - 1].tensor) +
                       " at " +
                       rangeString(Range{extents[i - 1].begin, extents[i - 1].end}));

  // The distinct shard ranges, in shard-index order, must tile the buffer.
  const int64_t shards = numShards(meshSizes, placements);
  std::vector<Range> shardRanges;
  shardRanges.reserve(static_cast<size_t>(shards));
  int64_t expectedBegin = 0;
  std::vector<int64_t> coords;
  for (int64_t s = 0; s < shards; ++s) {
    decodeShardIndex(s, meshSizes, placements, coords);
    const Range range = localRange(layout.size, meshSizes, coords, placements);
    if (range.begin != expectedBegin || range.size() != layout.size / shards)
      return makeError("shard " + std::to_string(s) + " owns " + rangeString(range) +
                       " but the shards must tile [0, " +
                       std::to_string(layout.size) + ") evenly in shard order");
    shardRanges.push_back(range);
    expectedBegin = range.end;
  }
  if (expectedBegin != layout.size)
    return makeError("shard ranges cover [0, " + std::to_string(expectedBegin) +
                     ") instead of the whole buffer [0, " +
                     std::to_string(layout.size) + ")");

  // Each tensor's pieces: whole rows, and over the shards that touch it they
  // tile its rows. Only the shards that overlap the tensor are visited, so
  // this is linear in tensors + pieces, not tensors * ranks.
  const int64_t shardLength = shards > 0 ? layout.size / shards : 0;
  for (size_t t = 0; t < shapes.size(); ++t) {
    const std::string name = "tensor " + std::to_string(t);
    const int64_t rows = rowSize(shapes[t]);
    const int64_t numel = numElements(shapes[t]);
    const int64_t offset = layout.offsets[t];
    if (shardLength == 0)
      return makeError(name + ": buffer of size 0 cannot hold it");
    const int64_t firstShard = offset / shardLength;
    const int64_t lastShard = (offset + numel - 1) / shardLength;
    int64_t nextRow = 0;
    for (int64_t s = firstShard; s <= lastShard; ++s) {
      const Range range = shardRanges[static_cast<size_t>(s)];
      const Range overlap = overlapElements(offset, numel, range);
      if (overlap.size() == 0)
        continue;
      if ((overlap.begin - offset) % rows != 0 || overlap.size() % rows != 0)
        return makeError(name + ": its piece in shard " + std::to_string(s) + " " +
                         rangeString(range) + " is elements " +
                         rangeString(overlap) + ", not whole rows of " +
                         std::to_string(rows) + " elements");
      const Piece piece = pieceOf(offset, shapes[t], range);
      if (piece.rowOffset != nextRow)
        return makeError(name + ": its piece in shard " + std::to_string(s) +
                         " starts at row " + std::to_string(piece.rowOffset) +
                         " but row " + std::to_string(nextRow) + " comes next");
      nextRow += piece.rows;
    }
    if (nextRow != shapes[t][0])
      return makeError(name + ": its pieces cover " + std::to_string(nextRow) +
                       " of " + std::to_string(shapes[t][0]) + " rows");
  }
  return Status::success();
}

//===----------------------------------------------------------------------===//
// Canonical Shard(0)
//===----------------------------------------------------------------------===//

Range canonicalShardRows(int64_t dim0, int64_t numShards, int64_t index) {
  if (numShards < 1 || dim0 <= 0)
    return Range{0, std::max<int64_t>(dim0, 0)};
  // ceil(dim0 / numShards) without overflow.
  const int64_t perShard = dim0 / numShards + (dim0 % numShards != 0);
  int64_t begin;
  if (!checkedMul(perShard, index, begin) || begin >= dim0)
    return Range{dim0, dim0};
  return Range{begin, begin + std::min(perShard, dim0 - begin)};
}

Range canonicalRowsForCoords(int64_t dim0, const std::vector<int64_t> &meshSizes,
                             const std::vector<int64_t> &coords,
                             const std::vector<Placement> &placements) {
  Range rows{0, dim0};
  // DTensor splits along mesh axes in order: axis 0 is the coarsest.
  for (size_t axis = 0; axis < meshSizes.size() && axis < coords.size() &&
                        axis < placements.size();
       ++axis) {
    if (placements[axis] != Placement::Shard)
      continue;
    const Range part = canonicalShardRows(rows.size(), meshSizes[axis], coords[axis]);
    rows = Range{rows.begin + part.begin, rows.begin + part.end};
  }
  return rows;
}

bool differsFromCanonical(int64_t tensorOffset, const Shape &shape,
                          int64_t bufferSize,
                          const std::vector<int64_t> &meshSizes,
                          const std::vector<Placement> &placements) {
  if (shape.empty())
    return false;
  // Replicate axes hold copies, so visiting one rank per shard covers all.
  const int64_t shards = numShards(meshSizes, placements);
  std::vector<int64_t> coords;
  for (int64_t s = 0; s < shards; ++s) {
    decodeShardIndex(s, meshSizes, placements, coords);
    const Piece real =
        pieceOf(tensorOffset, shape,
                localRange(bufferSize, meshSizes, coords, placements));
    const Range canonical =
        canonicalRowsForCoords(shape[0], meshSizes, coords, placements);
    if (real.rows != canonical.size())
      return true;
    if (!real.empty() && real.rowOffset != canonical.begin)
      return true;
  }
  return false;
}

//===----------------------------------------------------------------------===//
// Expert meshes
//===----------------------------------------------------------------------===//

std::vector<int64_t> ExpertMesh::meshSizes() const {
  std::vector<int64_t> sizes;
  for (size_t axis = 0; axis < viewSizes.size(); ++axis)
    if (static_cast<int64_t>(axis) != expertAxis)
      sizes.push_back(viewSizes[axis]);
  return sizes;
}

int64_t ExpertMesh::expertCoord(int64_t worldRank) const {
  return rankCoords(worldRank, viewSizes)[expertAxis];
}

int64_t ExpertMesh::meshRank(int64_t worldRank) const {
  std::vector<int64_t> coords = rankCoords(worldRank, viewSizes);
  coords.erase(coords.begin() + expertAxis);
  return flatRank(coords, meshSizes());
}

int64_t ExpertMesh::worldRank(int64_t meshRank, int64_t expert) const {
  std::vector<int64_t> coords = rankCoords(meshRank, meshSizes());
  coords.insert(coords.begin() + expertAxis, expert);
  return flatRank(coords, viewSizes);
}

Status checkExpertMesh(const ExpertMesh &mesh, int64_t worldSize) {
  if (mesh.expertAxis < 0 || mesh.expertAxis >= static_cast<int64_t>(mesh.viewSizes.size()))
    return makeError("the expert axis must be one of the view's " +
                     std::to_string(mesh.viewSizes.size()) + " axes");
  int64_t product = 1;
  for (int64_t size : mesh.viewSizes) {
    if (size < 1)
      return makeError("every axis of an expert mesh needs a positive size, got " +
                       std::to_string(size));
    if (size > worldSize || product * size > worldSize) // no overflow: both <= 2^63 / 2^31
      return makeError("the expert mesh has more ranks than the world's " +
                       std::to_string(worldSize));
    product *= size;
  }
  if (product != worldSize)
    return makeError("the expert mesh's axes multiply out to " + std::to_string(product) +
                     " ranks but the world mesh has " + std::to_string(worldSize));
  return Status::success();
}

std::optional<ExpertNumber> trailingExpertNumber(std::string_view name) {
  size_t digits = name.size();
  while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9')
    --digits;
  std::string_view number = name.substr(digits);
  // A stem, a number of at most 18 digits (no overflow), no leading zero.
  if (digits == 0 || number.empty() || number.size() > 18 ||
      (number.size() > 1 && number.front() == '0'))
    return std::nullopt;
  int64_t local = 0;
  for (char c : number)
    local = local * 10 + (c - '0');
  return ExpertNumber{digits, local};
}

std::optional<ExpertName> splitExpertFQN(std::string_view fqn, std::string_view unitFQN,
                                         ExpertNaming naming) {
  std::string unitPrefix = unitFQN.empty() ? std::string() : std::string(unitFQN) + ".";
  if (fqn.substr(0, unitPrefix.size()) != unitPrefix)
    return std::nullopt;
  if (naming == ExpertNaming::Grouped) {
    size_t lastDot = fqn.rfind('.');
    size_t nameBegin = lastDot == std::string_view::npos ? 0 : lastDot + 1;
    if (nameBegin < unitPrefix.size())
      return std::nullopt;
    std::optional<ExpertNumber> number = trailingExpertNumber(fqn.substr(nameBegin));
    if (!number)
      return std::nullopt;
    return ExpertName{std::string(fqn.substr(0, nameBegin + number->position)), number->local,
                      ""};
  }
  std::string head = unitPrefix + "local_experts.";
  if (fqn.substr(0, head.size()) != head)
    return std::nullopt;
  size_t dot = fqn.find('.', head.size());
  if (dot == std::string_view::npos || dot + 1 == fqn.size())
    return std::nullopt;
  // The whole component is the number: "<i>" with no stem.
  std::string_view component = fqn.substr(head.size(), dot - head.size());
  std::string probe = "x" + std::string(component);
  std::optional<ExpertNumber> number = trailingExpertNumber(probe);
  if (!number || number->position != 1)
    return std::nullopt;
  return ExpertName{head, number->local, std::string(fqn.substr(dot))};
}

} // namespace layout
} // namespace fsdp
