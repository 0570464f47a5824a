//===- Buffers.cpp - A rank's packed buffers ------------------------------===//
#include "fsdp/Runtime/Buffers.h"

#include "ModelWeightRefresh.h"
#include "Parallel.h"
#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Runtime/Cast.h"

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

namespace {

/// Every such group of `plan`, or group `onlyGroup` alone when it is not
/// negative.
Result<std::vector<ModelWeightCast>> castGroups(const plan::RankPlan &plan,
                                                const RankBuffers &buffers, int32_t onlyGroup) {
  std::vector<ModelWeightCast> groups;
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
    groups.push_back({buffer.group, *main, *model,
                      static_cast<uint64_t>(std::min(main->elements, model->elements))});
  }
  return groups;
}

/// Elements [first, end) of a group's main weight cast into its model weight.
struct CastRange {
  const ModelWeightCast *group;
  uint64_t first, end;
};

/// Casts `ranges` on the buffers' own backend (a device casts in device
/// memory). Host casts go in pieces that the workers share (a load's last
/// step: one thread casting every group ran about 60 ms of a 0.7 s warm
/// load); a device casts each range in one call on its own streams.
Status castRanges(RankBuffers &buffers, const std::vector<CastRange> &ranges, unsigned threads) {
  bool host = buffers.backend().kind() == MemoryKind::Host;
  constexpr uint64_t kPieceElements = uint64_t(4) << 20;
  std::vector<CastRange> pieces;
  for (const CastRange &range : ranges) {
    uint64_t piece = host ? kPieceElements : std::max<uint64_t>(range.end - range.first, 1);
    for (uint64_t first = range.first; first < range.end; first += piece)
      pieces.push_back({range.group, first, std::min(first + piece, range.end)});
  }
  return forEachItem(pieces.size(), host ? threads : 1, [&](size_t index, unsigned) -> Status {
    const CastRange &piece = pieces[index];
    auto at = [&](const BufferView &view) {
      return static_cast<char *>(view.data) + piece.first * dcp::dtypeInfo(view.dtype).elementSize;
    };
    if (Status status =
            buffers.backend().cast(piece.group->main.dtype, at(piece.group->main),
                                   piece.group->model.dtype, at(piece.group->model),
                                   piece.end - piece.first);
        !status)
      return propagate(status, "refreshing model_weight of group " +
                                   std::to_string(piece.group->group) + ": " + status.error());
    return Status::success();
  });
}

} // namespace

Status refreshModelWeights(const plan::RankPlan &plan, RankBuffers &buffers, int32_t onlyGroup,
                           unsigned threads) {
  Result<std::vector<ModelWeightCast>> groups = castGroups(plan, buffers, onlyGroup);
  if (!groups)
    return groups.failure();
  std::vector<CastRange> ranges;
  for (const ModelWeightCast &group : *groups)
    ranges.push_back({&group, 0, group.elements});
  return castRanges(buffers, ranges, threads);
}

Status checkModelWeights(const plan::RankPlan &plan, const RankBuffers &buffers) {
  Result<std::vector<ModelWeightCast>> groups = castGroups(plan, buffers, -1);
  if (!groups)
    return groups.failure();
  // Piece by piece through host memory, on any backend.
  constexpr uint64_t kPieceElements = uint64_t(1) << 20;
  for (const ModelWeightCast &group : *groups) {
    uint64_t mainSize = dcp::dtypeInfo(group.main.dtype).elementSize;
    uint64_t modelSize = dcp::dtypeInfo(group.model.dtype).elementSize;
    std::string main, expected, actual;
    for (uint64_t first = 0; first < group.elements; first += kPieceElements) {
      uint64_t count = std::min(kPieceElements, group.elements - first);
      main.resize(count * mainSize);
      expected.resize(count * modelSize);
      actual.resize(count * modelSize);
      if (Status status = group.main.copyOut(first * mainSize, main.size(), main.data()); !status)
        return status;
      if (Status status = group.model.copyOut(first * modelSize, actual.size(), actual.data());
          !status)
        return status;
      if (Status status = castElements(group.main.dtype, main.data(), group.model.dtype,
                                       expected.data(), count);
          !status)
        return status;
      if (expected != actual) {
        uint64_t at = 0;
        while (std::memcmp(expected.data() + at * modelSize, actual.data() + at * modelSize,
                           modelSize) == 0)
          ++at;
        return makeError("group " + std::to_string(group.group) + " model_weight element " +
                         std::to_string(first + at) + " is not its main_weight cast to " +
                         dcp::dtypeInfo(group.model.dtype).name);
      }
    }
  }
  return Status::success();
}

ModelWeightRefresh::ModelWeightRefresh(const plan::RankPlan &plan, RankBuffers &buffers)
    : buffers_(buffers) {
  Result<std::vector<ModelWeightCast>> groups = castGroups(plan, buffers, -1);
  if (!groups) {
    found_ = groups.failure();
    return;
  }
  bool host = buffers.backend().kind() == MemoryKind::Host;
  for (const ModelWeightCast &cast : *groups) {
    // A cast of no elements fails only for dtypes it cannot cast: those are
    // left to finish(), which says so.
    bool castable = castElements(cast.main.dtype, nullptr, cast.model.dtype, nullptr, 0).ok();
    groups_.push_back({cast, host && castable, {}});
  }
}

ModelWeightRefresh::Group *ModelWeightRefresh::find(int32_t group) {
  for (Group &candidate : groups_)
    if (candidate.cast.group == group)
      return &candidate;
  return nullptr;
}

bool ModelWeightRefresh::castsAsLanded(int32_t group) {
  Group *found = find(group);
  return found && found->castsAsLanded;
}

ModelWeightRefresh::Group *ModelWeightRefresh::wholeElements(int32_t group, const char *at,
                                                             uint64_t bytes, uint64_t &first,
                                                             uint64_t &end) {
  Group *found = find(group);
  if (!found || !found->castsAsLanded)
    return nullptr;
  const ModelWeightCast &cast = found->cast;
  const char *base = static_cast<const char *>(cast.main.data);
  // Compared as addresses: bytes of another buffer are not this one's.
  auto address = [](const char *p) { return reinterpret_cast<uintptr_t>(p); };
  if (address(at) < address(base) || bytes > cast.main.bytes ||
      address(at) - address(base) > cast.main.bytes - bytes)
    return nullptr; // finish() casts whatever this buffer did not get here
  uint64_t mainSize = dcp::dtypeInfo(cast.main.dtype).elementSize;
  uint64_t offset = address(at) - address(base);
  // The whole elements among the bytes; a cut one is left to finish().
  first = (offset + mainSize - 1) / mainSize;
  end = std::min((offset + bytes) / mainSize, cast.elements);
  return first < end ? found : nullptr;
}

void ModelWeightRefresh::record(Group &group, uint64_t first, uint64_t end) {
  std::lock_guard<std::mutex> lock(mutex_);
  group.landed.emplace_back(first, end);
}

void ModelWeightRefresh::landed(int32_t group, const char *at, uint64_t bytes) {
  uint64_t first = 0, end = 0;
  Group *found = wholeElements(group, at, bytes, first, end);
  if (!found)
    return;
  const ModelWeightCast &cast = found->cast;
  uint64_t mainSize = dcp::dtypeInfo(cast.main.dtype).elementSize;
  uint64_t modelSize = dcp::dtypeInfo(cast.model.dtype).elementSize;
  if (!castElements(cast.main.dtype, static_cast<const char *>(cast.main.data) + first * mainSize,
                    cast.model.dtype, static_cast<char *>(cast.model.data) + first * modelSize,
                    end - first))
    return; // not recorded: finish() casts it again and reports the error
  record(*found, first, end);
}

void ModelWeightRefresh::copyLanded(int32_t group, char *to, const char *from, uint64_t bytes) {
  uint64_t first = 0, end = 0;
  Group *found = wholeElements(group, to, bytes, first, end);
  if (!found) {
    copyBypassingCache(to, from, bytes);
    return;
  }
  const ModelWeightCast &cast = found->cast;
  uint64_t mainSize = dcp::dtypeInfo(cast.main.dtype).elementSize;
  uint64_t modelSize = dcp::dtypeInfo(cast.model.dtype).elementSize;
  char *base = static_cast<char *>(cast.main.data);
  // The bytes before the first whole element and after the last one are
  // only copied.
  uint64_t head = first * mainSize - static_cast<uint64_t>(to - base);
  uint64_t whole = (end - first) * mainSize;
  std::memcpy(to, from, head);
  std::memcpy(to + head + whole, from + head + whole, bytes - head - whole);
  if (!copyAndCastElements(cast.main.dtype, from + head, to + head, cast.model.dtype,
                           static_cast<char *>(cast.model.data) + first * modelSize,
                           end - first)) {
    std::memcpy(to + head, from + head, whole);
    return; // not recorded: finish() casts it again and reports the error
  }
  record(*found, first, end);
}

Status ModelWeightRefresh::finish(unsigned threads) {
  if (!found_)
    return found_;
  std::vector<CastRange> ranges;
  for (Group &group : groups_) {
    std::vector<std::pair<uint64_t, uint64_t>> &landed = group.landed;
    std::sort(landed.begin(), landed.end());
    uint64_t next = 0; // the first element not known to be cast
    for (const auto &[first, end] : landed) {
      if (first > next)
        ranges.push_back({&group.cast, next, first});
      next = std::max(next, end);
    }
    if (next < group.cast.elements)
      ranges.push_back({&group.cast, next, group.cast.elements});
  }
  return castRanges(buffers_, ranges, threads);
}

} // namespace runtime
} // namespace fsdp
