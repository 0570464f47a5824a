//===- Buffers.cpp - A rank's packed buffers ------------------------------===//
#include "fsdp/Runtime/Buffers.h"

#include "Parallel.h"
#include "fsdp/Format/DcpMetadata.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace fsdp {
namespace runtime {

namespace {
std::string bufferName(int32_t group, plan::BufferRole role) {
  return "group " + std::to_string(group) + " " + plan::bufferRoleName(role);
}
} // namespace

Status BufferView::copyOut(uint64_t offset, uint64_t count, void *host) const {
  if (offset > bytes || count > bytes - offset)
    return makeError("a copy out of a buffer past its end", ErrorKind::Internal);
  return backend->copyOut(static_cast<const char *>(data) + offset, host, count).get();
}

Status BufferView::copyIn(uint64_t offset, uint64_t count, const void *host) const {
  if (offset > bytes || count > bytes - offset)
    return makeError("a copy into a buffer past its end", ErrorKind::Internal);
  return backend->copyIn(host, static_cast<char *>(data) + offset, count).get();
}

Result<RankBuffers> RankBuffers::allocate(const plan::RankPlan &plan,
                                          std::shared_ptr<MemoryBackend> backend) {
  RankBuffers buffers;
  buffers.backend_ = backend ? std::move(backend) : createHostBackend();
  MemoryBackend *owner = buffers.backend_.get();
  buffers.layout_ = plan.buffers;
  for (const plan::LocalBuffer &buffer : plan.buffers) {
    if (buffer.aliasesMainWeight)
      continue;
    uint64_t elementSize = dcp::dtypeInfo(buffer.dtype).elementSize;
    if (buffer.elements < 0 ||
        static_cast<uint64_t>(buffer.elements) > (uint64_t(1) << 50) / elementSize)
      return makeError(bufferName(buffer.group, buffer.role) + " of " +
                       std::to_string(buffer.elements) + " elements is out of range");
    uint64_t bytes = static_cast<uint64_t>(buffer.elements) * elementSize;
    Result<void *> memory = owner->allocate(bytes);
    if (!memory)
      return propagate(memory, memory.error() + " for " + bufferName(buffer.group, buffer.role));
    buffers.owned_.emplace_back(*memory, [backend = buffers.backend_](void *p) {
      if (p)
        backend->release(p);
    });
    buffers.views_[{buffer.group, buffer.role}] = {*memory, bytes, buffer.dtype, buffer.elements,
                                                   owner};
  }
  for (const plan::LocalBuffer &buffer : plan.buffers)
    if (buffer.aliasesMainWeight) {
      auto main = buffers.views_.find({buffer.group, plan::BufferRole::MainWeight});
      if (main == buffers.views_.end())
        return makeError(bufferName(buffer.group, buffer.role) +
                         " aliases a main_weight buffer the plan does not have");
      buffers.views_[{buffer.group, buffer.role}] = main->second;
    }
  return buffers;
}

Result<RankBuffers>
RankBuffers::wrap(const plan::RankPlan &plan,
                  const std::map<std::pair<int32_t, plan::BufferRole>, void *> &memory,
                  std::shared_ptr<MemoryBackend> backend) {
  RankBuffers buffers;
  buffers.backend_ = backend ? std::move(backend) : createHostBackend();
  buffers.layout_ = plan.buffers;
  for (const plan::LocalBuffer &buffer : plan.buffers) {
    auto found = memory.find({buffer.group, buffer.role});
    if (found == memory.end() && buffer.aliasesMainWeight)
      found = memory.find({buffer.group, plan::BufferRole::MainWeight});
    if (found == memory.end() || (!found->second && buffer.elements))
      return makeError("no memory given for " + bufferName(buffer.group, buffer.role));
    uint64_t bytes =
        static_cast<uint64_t>(buffer.elements) * dcp::dtypeInfo(buffer.dtype).elementSize;
    buffers.views_[{buffer.group, buffer.role}] = {found->second, bytes, buffer.dtype,
                                                   buffer.elements, buffers.backend_.get()};
  }
  return buffers;
}

Result<BufferView> RankBuffers::get(int32_t group, plan::BufferRole role) const {
  auto found = views_.find({group, role});
  if (found == views_.end())
    return makeError("this rank has no buffer " + bufferName(group, role));
  return found->second;
}

Status refreshModelWeights(const plan::RankPlan &plan, RankBuffers &buffers, int32_t onlyGroup,
                           unsigned threads) {
  struct Cast {
    int32_t group;
    BufferView main, model;
    uint64_t first, elements;
  };
  // Host casts go in pieces that the workers share (a load's last step: one
  // thread casting every group ran about 60 ms of a 0.7 s warm load); a
  // device casts each buffer in one call on its own streams.
  bool host = buffers.backend().kind() == MemoryKind::Host;
  constexpr uint64_t kPieceElements = uint64_t(4) << 20;
  std::vector<Cast> casts;
  for (const plan::LocalBuffer &buffer : plan.buffers) {
    if (buffer.role != plan::BufferRole::ModelWeight || buffer.aliasesMainWeight)
      continue;
    if (onlyGroup >= 0 && buffer.group != onlyGroup)
      continue;
    Result<BufferView> main = buffers.get(buffer.group, plan::BufferRole::MainWeight);
    if (!main)
      return main.failure();
    Result<BufferView> model = buffers.get(buffer.group, plan::BufferRole::ModelWeight);
    if (!model)
      return model.failure();
    uint64_t elements = static_cast<uint64_t>(std::min(main->elements, model->elements));
    uint64_t piece = host ? kPieceElements : std::max<uint64_t>(elements, 1);
    for (uint64_t first = 0; first < elements; first += piece)
      casts.push_back({buffer.group, *main, *model, first, std::min(piece, elements - first)});
  }
  return forEachItem(casts.size(), host ? threads : 1, [&](size_t index, unsigned) -> Status {
    const Cast &cast = casts[index];
    auto at = [&](const BufferView &view) {
      return static_cast<char *>(view.data) + cast.first * dcp::dtypeInfo(view.dtype).elementSize;
    };
    // On the buffers' own backend: a device casts in device memory.
    if (Status status = buffers.backend().cast(cast.main.dtype, at(cast.main), cast.model.dtype,
                                               at(cast.model), cast.elements);
        !status)
      return propagate(status, "refreshing model_weight of group " + std::to_string(cast.group) +
                                   ": " + status.error());
    return Status::success();
  });
}

} // namespace runtime
} // namespace fsdp
