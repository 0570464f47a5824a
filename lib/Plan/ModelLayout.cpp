//===- ModelLayout.cpp - A lowered model in plain C++ terms ---------------===//
#include "fsdp/Plan/ModelLayout.h"
#include "fsdp/Format/Limits.h"

#include <set>

namespace fsdp {
namespace plan {

const char *bufferRoleName(BufferRole role) {
  switch (role) {
  case BufferRole::MainWeight:
    return "main_weight";
  case BufferRole::ModelWeight:
    return "model_weight";
  case BufferRole::MainGrad:
    return "main_grad";
  case BufferRole::ExpAvg:
    return "exp_avg";
  case BufferRole::ExpAvgSq:
    return "exp_avg_sq";
  case BufferRole::MaxExpAvgSq:
    return "max_exp_avg_sq";
  case BufferRole::MomentumBuffer:
    return "momentum_buffer";
  }
  return "unknown";
}

const char *optimizerKindName(OptimizerKind kind) {
  switch (kind) {
  case OptimizerKind::Adam:
    return "adam";
  case OptimizerKind::AdamW:
    return "adamw";
  case OptimizerKind::SGD:
    return "sgd";
  }
  return "unknown";
}

bool isOptimizerStateRole(BufferRole role) {
  return role != BufferRole::MainWeight && role != BufferRole::ModelWeight &&
         role != BufferRole::MainGrad;
}

const BufferSpec *GroupSpec::findBuffer(BufferRole role) const {
  for (const BufferSpec &buffer : buffers)
    if (buffer.role == role)
      return &buffer;
  return nullptr;
}

Status checkModelLayout(const ModelLayout &model) {
  if (model.meshAxisNames.size() != model.meshSizes.size())
    return makeError("mesh has " + std::to_string(model.meshAxisNames.size()) + " axis names but " +
                     std::to_string(model.meshSizes.size()) + " sizes");
  if (model.meshSizes.empty())
    return makeError("the mesh has no axes");
  int64_t world = 1;
  for (int64_t size : model.meshSizes) {
    if (size < 1 || world > (int64_t(1) << 31) / size)
      return makeError("mesh sizes must be positive with at most 2^31 ranks in all");
    world *= size;
  }
  std::set<BufferRole> stateRoles;
  for (BufferRole role : model.optimizer.stateRoles)
    if (!isOptimizerStateRole(role) || !stateRoles.insert(role).second)
      return makeError(std::string("the optimizer's state tensors list ") + bufferRoleName(role) +
                       " twice or as state");
  std::set<std::string> fqns;
  for (size_t g = 0; g < model.groups.size(); ++g) {
    const GroupSpec &group = model.groups[g];
    std::string where = "group " + std::to_string(g) + " (unit \"" + group.unit + "\")";
    if (Status status = layout::checkPlacements(model.meshSizes, group.placements); !status)
      return propagate(status, where + ": " + status.error());
    std::vector<layout::Shape> shapes;
    layout::PackedLayout packed{group.chunk, group.size, {}};
    for (const MemberSpec &member : group.members) {
      if (member.fqns.empty())
        return makeError(where + ": a member has no FQN");
      for (const std::string &fqn : member.fqns)
        if (!fqns.insert(fqn).second)
          return makeError(where + ": FQN '" + fqn + "' appears twice");
      shapes.push_back(member.shape);
      packed.offsets.push_back(member.offset);
    }
    if (Status status = layout::verifyLayout(shapes, packed, model.meshSizes, group.placements);
        !status)
      return propagate(status, where + ": " + status.error());
    int64_t shards = layout::numShards(model.meshSizes, group.placements);
    if (group.shardSize * shards != group.size)
      return makeError(where + ": shard size " + std::to_string(group.shardSize) + " x " +
                       std::to_string(shards) + " shards != size " + std::to_string(group.size));
    if (!group.findBuffer(BufferRole::MainWeight))
      return makeError(where + ": no main_weight buffer");
    // What the runtime would refuse to read back is refused here, by name.
    for (const BufferSpec &buffer : group.buffers) {
      uint64_t elementSize = dcp::dtypeInfo(buffer.dtype).elementSize;
      if (static_cast<uint64_t>(group.shardSize) > limits::kMaxBufferBytes / elementSize)
        return makeError(where + ": its " + bufferRoleName(buffer.role) + " buffer is " +
                         std::to_string(group.shardSize) + " elements of " +
                         std::to_string(elementSize) + " bytes per rank, past the runtime's " +
                         "limit of 2^48 bytes: shard it over more ranks");
    }
    for (const MemberSpec &member : group.members)
      for (const std::string &fqn : member.fqns)
        // The longest key of a parameter: optimizer.state.<fqn>.max_exp_avg_sq.
        if (fqn.size() + 64 > limits::kMaxKeyBytes)
          return makeError(where + ": a parameter name of " + std::to_string(fqn.size()) +
                           " bytes (starting '" + fqn.substr(0, 40) + "') makes checkpoint keys "
                           "past the runtime's limit of " +
                           std::to_string(limits::kMaxKeyBytes) + " bytes");
    if (group.requiresGrad && model.optimizer.present)
      for (BufferRole role : model.optimizer.stateRoles)
        if (!group.findBuffer(role))
          return makeError(where + ": a trainable group needs a " + bufferRoleName(role) +
                           " buffer for the optimizer's state");
  }
  // The optimizer's params: unique leading FQNs of trainable members.
  std::set<std::string> trainable, seen;
  for (const GroupSpec &group : model.groups)
    if (group.requiresGrad)
      for (const MemberSpec &member : group.members)
        trainable.insert(member.fqns.front());
  for (const std::string &fqn : model.optimizerParams) {
    if (!trainable.count(fqn))
      return makeError("optimizer parameter '" + fqn +
                       "' is not the leading FQN of a trainable member");
    if (!seen.insert(fqn).second)
      return makeError("optimizer parameter '" + fqn + "' is listed twice");
  }
  return Status::success();
}

} // namespace plan
} // namespace fsdp
