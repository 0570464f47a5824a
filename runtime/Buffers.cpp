//===- Buffers.cpp - A rank's packed buffers ------------------------------===//
#include "fsdp/Runtime/Buffers.h"

#include <cstdlib>
#include <cstring>

namespace fsdp {
namespace runtime {

namespace {
std::string bufferName(int32_t group, plan::BufferRole role) {
  return "group " + std::to_string(group) + " " + plan::bufferRoleName(role);
}
} // namespace

Result<RankBuffers> RankBuffers::allocate(const plan::RankPlan &plan) {
  RankBuffers buffers;
  buffers.layout_ = plan.buffers;
  for (const plan::LocalBuffer &buffer : plan.buffers) {
    if (buffer.aliasesMainWeight)
      continue;
    uint64_t elementSize = dcp::dtypeInfo(buffer.dtype).elementSize;
    if (buffer.elements < 0 || static_cast<uint64_t>(buffer.elements) > (uint64_t(1) << 50) / elementSize)
      return makeError(bufferName(buffer.group, buffer.role) + " of " +
                       std::to_string(buffer.elements) + " elements is out of range");
    uint64_t bytes = static_cast<uint64_t>(buffer.elements) * elementSize;
    // Rounded up to the alignment, as aligned_alloc requires.
    uint64_t rounded = (bytes + 4095) / 4096 * 4096;
    void *memory = rounded ? std::aligned_alloc(4096, rounded) : nullptr;
    if (rounded && !memory)
      return makeError("cannot allocate " + std::to_string(bytes) + " bytes for " +
                       bufferName(buffer.group, buffer.role));
    if (memory)
      std::memset(memory, 0, rounded);
    buffers.owned_.emplace_back(memory);
    buffers.views_[{buffer.group, buffer.role}] = {memory, bytes, buffer.dtype, buffer.elements};
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

Result<RankBuffers> RankBuffers::wrap(
    const plan::RankPlan &plan,
    const std::map<std::pair<int32_t, plan::BufferRole>, void *> &memory) {
  RankBuffers buffers;
  buffers.layout_ = plan.buffers;
  for (const plan::LocalBuffer &buffer : plan.buffers) {
    auto found = memory.find({buffer.group, buffer.role});
    if (found == memory.end() && buffer.aliasesMainWeight)
      found = memory.find({buffer.group, plan::BufferRole::MainWeight});
    if (found == memory.end() || (!found->second && buffer.elements))
      return makeError("no memory given for " + bufferName(buffer.group, buffer.role));
    uint64_t bytes = static_cast<uint64_t>(buffer.elements) * dcp::dtypeInfo(buffer.dtype).elementSize;
    buffers.views_[{buffer.group, buffer.role}] = {found->second, bytes, buffer.dtype, buffer.elements};
  }
  return buffers;
}

Result<BufferView> RankBuffers::get(int32_t group, plan::BufferRole role) const {
  auto found = views_.find({group, role});
  if (found == views_.end())
    return makeError("this rank has no buffer " + bufferName(group, role));
  return found->second;
}

uint64_t RankBuffers::totalBytes() const {
  uint64_t total = 0;
  for (const plan::LocalBuffer &buffer : layout_)
    if (!buffer.aliasesMainWeight)
      total += static_cast<uint64_t>(buffer.elements) * dcp::dtypeInfo(buffer.dtype).elementSize;
  return total;
}

} // namespace runtime
} // namespace fsdp
