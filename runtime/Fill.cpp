//===- Fill.cpp - Fill and check a rank's buffers from a seed -------------===//
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/Values.h"

namespace fsdp {
namespace runtime {

namespace {
/// Calls `visit(read, data, firstElement)` for every piece a rank holds, with
/// `data` in host memory: the buffer itself when the host may touch it,
/// else a staging copy (copied out first when the visit reads, copied back
/// when it `writes`).
template <typename Visit>
Status forEachPiece(const plan::RankPlan &plan, const RankBuffers &buffers, bool writes,
                    Visit visit) {
  std::string staging;
  for (const plan::ReadItem &read : plan.reads) {
    if (read.source != plan::ItemSource::Buffer)
      continue;
    Result<BufferView> view = buffers.get(read.buffer.group, read.buffer.role);
    if (!view)
      return propagate(view, read.key + ": " + view.error());
    uint64_t elementSize = dcp::dtypeInfo(view->dtype).elementSize;
    uint64_t rowSize = 1;
    for (size_t d = 1; d < read.chunkSizes.size(); ++d)
      rowSize *= static_cast<uint64_t>(read.chunkSizes[d]);
    uint64_t first = read.chunkOffsets.empty() ? 0 : read.chunkOffsets[0] * rowSize;
    uint64_t offset = static_cast<uint64_t>(read.buffer.localOffset) * elementSize;
    uint64_t bytes = static_cast<uint64_t>(read.buffer.elements) * elementSize;
    bool direct = view->backend->hostAccessible();
    char *data = static_cast<char *>(view->data) + offset;
    if (!direct) {
      staging.resize(bytes);
      data = staging.data();
      if (!writes)
        if (Status status = view->copyOut(offset, bytes, data); !status)
          return propagate(status, read.key + ": " + status.error());
    }
    if (Status status = visit(read, data, first); !status)
      return status;
    if (!direct && writes)
      if (Status status = view->copyIn(offset, bytes, data); !status)
        return propagate(status, read.key + ": " + status.error());
  }
  return Status::success();
}
} // namespace

Status fillFromSeed(const plan::RankPlan &plan, RankBuffers &buffers, uint32_t seed) {
  Status status = forEachPiece(
      plan, buffers, /*writes=*/true,
      [&](const plan::ReadItem &read, char *data, uint64_t first) -> Status {
        if (Status s = fillTestValues(read.dtype, fnv1a32(read.key), first,
                                      static_cast<uint64_t>(read.buffer.elements), seed, data);
            !s)
          return propagate(s, read.key + ": " + s.error());
        return Status::success();
      });
  if (!status)
    return status;
  // model_weight follows main_weight, as after an optimizer step.
  return refreshModelWeights(plan, buffers);
}

Status checkAgainstSeed(const plan::RankPlan &plan, const RankBuffers &buffers, uint32_t seed) {
  return forEachPiece(
      plan, buffers, /*writes=*/false,
      [&](const plan::ReadItem &read, char *data, uint64_t first) -> Status {
        if (Status s = checkTestValues(read.dtype, fnv1a32(read.key), first,
                                       static_cast<uint64_t>(read.buffer.elements), seed, data);
            !s) {
          std::string offsets;
          for (int64_t o : read.chunkOffsets)
            offsets += (offsets.empty() ? "" : ", ") + std::to_string(o);
          return propagate(s, read.key + " (chunk at [" + offsets + "]): " + s.error());
        }
        return Status::success();
      });
}

} // namespace runtime
} // namespace fsdp
