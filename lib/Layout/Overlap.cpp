//===- Overlap.cpp - Chunk overlap for resharding loads -------------------===//

#include "fsdp/Layout/Overlap.h"

#include <algorithm>

namespace fsdp {
namespace layout {

namespace {

/// Row-major strides of a box's storage.
std::vector<int64_t> stridesOf(const Box &box) {
  std::vector<int64_t> strides(box.sizes.size(), 1);
  for (size_t d = box.sizes.size(); d-- > 1;)
    strides[d - 1] = strides[d] * box.sizes[d];
  return strides;
}

/// Storage offset in `box` of the global point `point`.
int64_t storageOffset(const Box &box, const std::vector<int64_t> &strides,
                      const std::vector<int64_t> &point) {
  int64_t offset = 0;
  for (size_t d = 0; d < point.size(); ++d)
    offset += (point[d] - box.offsets[d]) * strides[d];
  return offset;
}

/// Whether `box` spans `target` entirely in every dim but 0.
bool isRowRangeOf(const Box &box, const Box &target) {
  for (size_t d = 1; d < target.sizes.size(); ++d)
    if (box.offsets[d] > target.offsets[d] ||
        box.offsets[d] + box.sizes[d] < target.offsets[d] + target.sizes[d])
      return false;
  return true;
}

/// Is the slab of `target` in dims [dim, rank) covered by `boxes` (already
/// clipped to target)? Sweeps dim `dim` over the boxes' boundaries; within
/// each elementary interval the boxes that span it must cover the rest.
bool coversFromDim(const std::vector<const Box *> &boxes, const Box &target,
                   size_t dim) {
  if (boxes.empty())
    return false;
  if (dim == target.sizes.size())
    return true;
  std::vector<int64_t> cuts;
  cuts.reserve(2 * boxes.size() + 2);
  cuts.push_back(target.offsets[dim]);
  cuts.push_back(target.offsets[dim] + target.sizes[dim]);
  for (const Box *box : boxes) {
    cuts.push_back(box->offsets[dim]);
    cuts.push_back(box->offsets[dim] + box->sizes[dim]);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());

  std::vector<const Box *> previous, active;
  bool first = true;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const int64_t lo = cuts[i], hi = cuts[i + 1];
    active.clear();
    for (const Box *box : boxes)
      if (box->offsets[dim] <= lo && box->offsets[dim] + box->sizes[dim] >= hi)
        active.push_back(box);
    // The same set of boxes gives the same answer as the interval before.
    if (!first && active == previous)
      continue;
    if (!coversFromDim(active, target, dim + 1))
      return false;
    previous.swap(active);
    first = false;
  }
  return true;
}

} // namespace

int64_t boxElements(const Box &box) {
  int64_t count = 1;
  for (int64_t size : box.sizes) {
    if (size <= 0)
      return 0;
    count *= size;
  }
  return count;
}

std::optional<Box> intersect(const Box &a, const Box &b) {
  const size_t rank = a.sizes.size();
  if (a.offsets.size() != rank || b.sizes.size() != rank || b.offsets.size() != rank)
    return std::nullopt;
  Box common;
  common.offsets.resize(rank);
  common.sizes.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (lo >= hi)
      return std::nullopt;
    common.offsets[d] = lo;
    common.sizes[d] = hi - lo;
  }
  return common;
}

void overlapRuns(const Box &src, const Box &dst, std::vector<CopyRun> &out) {
  const std::optional<Box> common = intersect(src, dst);
  if (!common)
    return;
  const size_t rank = common->sizes.size();
  const std::vector<int64_t> srcStrides = stridesOf(src);
  const std::vector<int64_t> dstStrides = stridesOf(dst);
  const int64_t srcBase = storageOffset(src, srcStrides, common->offsets);
  const int64_t dstBase = storageOffset(dst, dstStrides, common->offsets);
  if (rank == 0) {
    out.push_back(CopyRun{0, 0, 1});
    return;
  }

  // Merge trailing dims that are full width in the overlap and in both boxes:
  // dims [innerDim, rank) then form one contiguous run in each storage. For
  // row-range boxes this reaches dim 0 and the whole overlap is one run.
  size_t innerDim = rank - 1;
  int64_t runLength = common->sizes[innerDim];
  while (innerDim > 0 && common->sizes[innerDim] == src.sizes[innerDim] &&
         common->sizes[innerDim] == dst.sizes[innerDim]) {
    --innerDim;
    runLength *= common->sizes[innerDim];
  }
  if (innerDim == 0) {
    out.push_back(CopyRun{srcBase, dstBase, runLength});
    return;
  }

  // One run per index of the outer dims [0, innerDim), row-major. Dim
  // innerDim is not full width in some storage, so consecutive runs are never
  // contiguous in both and cannot merge further.
  std::vector<int64_t> index(innerDim, 0);
  int64_t srcOffset = srcBase, dstOffset = dstBase;
  while (true) {
    out.push_back(CopyRun{srcOffset, dstOffset, runLength});
    // Advance the odometer over the outer dims, last one fastest.
    size_t d = innerDim;
    while (d-- > 0) {
      srcOffset += srcStrides[d];
      dstOffset += dstStrides[d];
      if (++index[d] < common->sizes[d])
        break;
      srcOffset -= srcStrides[d] * common->sizes[d];
      dstOffset -= dstStrides[d] * common->sizes[d];
      index[d] = 0;
    }
    if (d == static_cast<size_t>(-1))
      return;
  }
}

bool covers(const std::vector<Box> &saved, const Box &target) {
  const size_t rank = target.sizes.size();
  if (target.offsets.size() != rank)
    return false;
  if (boxElements(target) == 0)
    return true;

  std::vector<Box> clipped;
  for (const Box &box : saved)
    if (std::optional<Box> common = intersect(box, target))
      clipped.push_back(std::move(*common));
  if (clipped.empty())
    return false;
  if (rank == 0)
    return true;

  // Row ranges: an interval cover of dim 0.
  const bool allRowRanges = std::all_of(clipped.begin(), clipped.end(),
                                        [&](const Box &b) { return isRowRangeOf(b, target); });
  if (allRowRanges) {
    std::sort(clipped.begin(), clipped.end(), [](const Box &a, const Box &b) {
      return a.offsets[0] < b.offsets[0];
    });
    int64_t coveredTo = target.offsets[0];
    for (const Box &box : clipped) {
      if (box.offsets[0] > coveredTo)
        return false;
      coveredTo = std::max(coveredTo, box.offsets[0] + box.sizes[0]);
    }
    return coveredTo >= target.offsets[0] + target.sizes[0];
  }

  std::vector<const Box *> boxes;
  boxes.reserve(clipped.size());
  for (const Box &box : clipped)
    boxes.push_back(&box);
  return coversFromDim(boxes, target, 0);
}

} // namespace layout
} // namespace fsdp
