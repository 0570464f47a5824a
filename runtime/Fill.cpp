//===- Fill.cpp - Fill and check a rank's buffers from a seed -------------===//
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/Values.h"

namespace fsdp {
namespace runtime {

namespace {
/// Where one piece of test values goes: `count` elements of `dtype`,
/// element `first` onwards of key `key`'s tensor.
struct Piece {
  const plan::ReadItem &read;
  uint64_t first, count;
};

/// Calls `visit(piece, data)` for every piece a rank holds, with `data` in
/// host memory: the buffer itself when the host may touch it, else a
/// staging copy (copied out first when the visit reads, copied back when
/// it `writes`). A backend with test-value kernels gets `onDevice(piece,
/// view, data)` on its own memory instead: no copy at all.
template <typename Visit, typename OnDevice>
Status forEachPiece(const plan::RankPlan &plan, const RankBuffers &buffers, bool writes,
                    Visit visit, OnDevice onDevice, const KeySelection &keys = {}) {
  std::string staging;
  for (const plan::ReadItem &read : plan.reads) {
    if (read.source != plan::ItemSource::Buffer || !keys.selects(read.key))
      continue;
    Result<BufferView> view = buffers.get(read.buffer.group, read.buffer.role);
    if (!view)
      return propagate(view, read.key + ": " + view.error());
    uint64_t elementSize = dcp::dtypeInfo(view->dtype).elementSize;
    uint64_t rowSize = 1;
    for (size_t d = 1; d < read.chunkSizes.size(); ++d)
      rowSize *= static_cast<uint64_t>(read.chunkSizes[d]);
    Piece piece{read, read.chunkOffsets.empty() ? 0 : read.chunkOffsets[0] * rowSize,
                static_cast<uint64_t>(read.buffer.elements)};
    uint64_t offset = static_cast<uint64_t>(read.buffer.localOffset) * elementSize;
    uint64_t bytes = piece.count * elementSize;
    if (offset + bytes > view->bytes)
      return makeError(read.key + ": the plan's piece does not fit its buffer",
                       ErrorKind::InvalidArgument);
    char *data = static_cast<char *>(view->data) + offset;
    if (view->backend->hasTestValueKernels() && !view->backend->hostAccessible()) {
      if (Status status = onDevice(piece, *view->backend, data); !status)
        return status;
      continue;
    }
    bool direct = view->backend->hostAccessible();
    if (!direct) {
      staging.resize(bytes);
      data = staging.data();
      if (!writes)
        if (Status status = view->copyOut(offset, bytes, data); !status)
          return propagate(status, read.key + ": " + status.error());
    }
    if (Status status = visit(piece, data); !status)
      return status;
    if (!direct && writes)
      if (Status status = view->copyIn(offset, bytes, data); !status)
        return propagate(status, read.key + ": " + status.error());
  }
  return Status::success();
}

Status checkFailed(const plan::ReadItem &read, const Status &status) {
  std::string offsets;
  for (int64_t o : read.chunkOffsets)
    offsets += (offsets.empty() ? "" : ", ") + std::to_string(o);
  return propagate(status, read.key + " (chunk at [" + offsets + "]): " + status.error());
}
} // namespace

Status fillFromSeed(const plan::RankPlan &plan, RankBuffers &buffers, uint32_t seed) {
  auto fillFailed = [](const Piece &piece, const Status &status) {
    return propagate(status, piece.read.key + ": " + status.error());
  };
  Status status = forEachPiece(
      plan, buffers, /*writes=*/true,
      [&](const Piece &piece, char *data) -> Status {
        if (Status s = fillTestValues(piece.read.dtype, fnv1a32(piece.read.key), piece.first,
                                      piece.count, seed, data);
            !s)
          return fillFailed(piece, s);
        return Status::success();
      },
      [&](const Piece &piece, MemoryBackend &backend, char *data) -> Status {
        if (Status s = backend.fillTestValues(piece.read.dtype, fnv1a32(piece.read.key),
                                              piece.first, piece.count, seed, data);
            !s)
          return fillFailed(piece, s);
        return Status::success();
      });
  if (!status)
    return status;
  // model_weight follows main_weight, as after an optimizer step.
  return refreshModelWeights(plan, buffers);
}

Status checkAgainstSeed(const plan::RankPlan &plan, const RankBuffers &buffers, uint32_t seed,
                        const KeySelection &keys) {
  return forEachPiece(
      plan, buffers, /*writes=*/false,
      [&](const Piece &piece, char *data) -> Status {
        if (Status s = checkTestValues(piece.read.dtype, fnv1a32(piece.read.key), piece.first,
                                       piece.count, seed, data);
            !s)
          return checkFailed(piece.read, s);
        return Status::success();
      },
      [&](const Piece &piece, MemoryBackend &backend, char *data) -> Status {
        if (Status s = backend.checkTestValues(piece.read.dtype, fnv1a32(piece.read.key),
                                               piece.first, piece.count, seed, data);
            !s)
          return checkFailed(piece.read, s);
        return Status::success();
      },
      keys);
}

} // namespace runtime
} // namespace fsdp
