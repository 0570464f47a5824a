//===- Fill.cpp - Fill and check a rank's buffers from a seed -------------===//
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/Values.h"

namespace fsdp {
namespace runtime {

namespace {
/// Calls `visit(read, data, firstElement)` for every piece a rank holds.
template <typename Visit>
Status forEachPiece(const plan::RankPlan &plan, const RankBuffers &buffers, Visit visit) {
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
    if (Status status = visit(
            read, static_cast<char *>(view->data) + read.buffer.localOffset * elementSize, first);
        !status)
      return status;
  }
  return Status::success();
}
} // namespace

Status fillFromSeed(const plan::RankPlan &plan, RankBuffers &buffers, uint32_t seed) {
  Status status = forEachPiece(
      plan, buffers, [&](const plan::ReadItem &read, char *data, uint64_t first) -> Status {
        if (Status s = fillTestValues(read.dtype, fnv1a32(read.key), first,
                                      static_cast<uint64_t>(read.buffer.elements), seed, data);
            !s)
          return propagate(s, read.key + ": " + s.error());
        return Status::success();
      });
  if (!status)
    return status;
  // model_weight follows main_weight, as after an optimizer step.
  for (const plan::LocalBuffer &buffer : plan.buffers) {
    if (buffer.role != plan::BufferRole::ModelWeight || buffer.aliasesMainWeight)
      continue;
    Result<BufferView> main = buffers.get(buffer.group, plan::BufferRole::MainWeight);
    Result<BufferView> model = buffers.get(buffer.group, plan::BufferRole::ModelWeight);
    if (main && model)
      if (Status s = castElements(main->dtype, main->data, model->dtype, model->data,
                                  static_cast<uint64_t>(model->elements));
          !s)
        return s;
  }
  return Status::success();
}

Status checkAgainstSeed(const plan::RankPlan &plan, const RankBuffers &buffers, uint32_t seed) {
  return forEachPiece(
      plan, buffers, [&](const plan::ReadItem &read, char *data, uint64_t first) -> Status {
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
