//===- Overlap.h - Chunk overlap for resharding loads -----------*- C++ -*-===//
//
// A checkpoint stores each tensor as chunks (n-d boxes of the global tensor);
// a load fills the target's chunks from whichever saved chunks overlap them.
// Packed-buffer layouts only produce row-range chunks (full in every dim but
// 0), which reduce to one contiguous copy; other writers (PyTorch DCP with
// Shard(1), TP) produce general boxes, handled correctly if less quickly.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_LAYOUT_OVERLAP_H
#define FSDP_LAYOUT_OVERLAP_H

#include <cstdint>
#include <optional>
#include <vector>

namespace fsdp {
namespace layout {

/// An n-d chunk of a global tensor: element [offsets, offsets + sizes) in
/// every dim, stored row-major. A rank-0 box (both vectors empty) is a scalar.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  bool operator==(const Box &other) const {
    return offsets == other.offsets && sizes == other.sizes;
  }
};

/// Element count of a box (1 for rank 0, 0 if any size is <= 0).
int64_t boxElements(const Box &box);

/// The common part of two boxes of the same rank; nullopt when it is empty
/// or the ranks differ.
std::optional<Box> intersect(const Box &a, const Box &b);

/// One copy between a saved chunk and a target chunk: `count` contiguous
/// elements starting at srcElementOffset in the source box's row-major
/// storage and at dstElementOffset in the destination box's.
struct CopyRun {
  int64_t srcElementOffset;
  int64_t dstElementOffset;
  int64_t count;
  bool operator==(const CopyRun &other) const {
    return srcElementOffset == other.srcElementOffset &&
           dstElementOffset == other.dstElementOffset && count == other.count;
  }
};

/// Appends to `out` the copies that move the overlap of `src` and `dst` from
/// src's storage into dst's, in row-major order of the overlap. Trailing dims
/// where the overlap is full width in both boxes merge into one run, so
/// row-range boxes (full in every dim but 0) yield exactly one run; a general
/// overlap yields one run per index of the remaining outer dims (the fewest
/// runs possible). Nothing is appended when the boxes do not overlap.
void overlapRuns(const Box &src, const Box &dst, std::vector<CopyRun> &out);

/// True when every element of `target` lies in at least one of `saved`
/// (saved boxes may overlap each other and extend past the target; boxes of
/// another rank are ignored). An empty target is covered. Row-range boxes
/// take a sort-and-sweep path; general boxes are checked exactly by sweeping
/// one dim at a time.
bool covers(const std::vector<Box> &saved, const Box &target);

} // namespace layout
} // namespace fsdp

#endif // FSDP_LAYOUT_OVERLAP_H
