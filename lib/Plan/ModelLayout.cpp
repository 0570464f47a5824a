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

std::string GroupSpec::memberFQN(const MemberSpec &member, size_t fqn, int64_t expertCoord) const {
  if (!experts || !member.expert)
    return member.fqns[fqn];
  return member.expert->withNumber(
      layout::globalExpert(member.expert->local, expertCoord, experts->perRank));
}

std::vector<int64_t> groupShardOfRank(const ModelLayout &model, const GroupSpec &group) {
  std::vector<int64_t> meshShards =
      layout::shardIndices(model.groupMeshSizes(group), group.placements);
  if (!group.experts)
    return meshShards;
  const layout::ExpertMesh &mesh = group.experts->mesh;
  int64_t perGroup = layout::numShards(mesh.meshSizes(), group.placements);
  std::vector<int64_t> shards(static_cast<size_t>(model.worldSize()));
  for (int64_t rank = 0; rank < model.worldSize(); ++rank)
    shards[rank] = mesh.expertCoord(rank) * perGroup + meshShards[mesh.meshRank(rank)];
  return shards;
}

int64_t groupShardCount(const ModelLayout &model, const GroupSpec &group) {
  return layout::numShards(model.groupMeshSizes(group), group.placements) *
         group.expertGroups();
}

/// An experts group's mesh fits the world, and every member is one untied
/// expert parameter whose split FQN gives it back, below the rank's count.
static Status checkExpertGroup(const ModelLayout &model, const GroupSpec &group,
                               const std::string &where) {
  if (!group.experts) {
    for (const MemberSpec &member : group.members)
      if (member.expert)
        return makeError(where + ": member '" + member.fqns.front() +
                         "' is named as an expert but its group holds no experts");
    return Status::success();
  }
  if (Status status = layout::checkExpertMesh(group.experts->mesh, model.worldSize()); !status)
    return propagate(status, where + ": " + status.error());
  if (group.experts->mesh.viewSizes.size() < 2)
    return makeError(where + ": the experts' mesh needs an axis besides the expert axis");
  int64_t perRank = group.experts->perRank;
  if (perRank < 1)
    return makeError(where + ": each rank must hold at least one expert");
  for (const MemberSpec &member : group.members) {
    const std::string &fqn = member.fqns.front();
    if (!member.expert || member.fqns.size() != 1)
      return makeError(where + ": member '" + fqn +
                       "' must be one untied parameter with a local expert number");
    if (member.expert->local < 0 || member.expert->local >= perRank)
      return makeError(where + ": member '" + fqn + "' is local expert " +
                       std::to_string(member.expert->local) + " but each rank holds " +
                       std::to_string(perRank));
    if (member.expert->withNumber(member.expert->local) != fqn)
      return makeError(where + ": member '" + fqn + "' does not split into its expert name");
  }
  return Status::success();
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
    if (Status status = checkExpertGroup(model, group, where); !status)
      return status;
    std::vector<int64_t> meshSizes = model.groupMeshSizes(group);
    if (Status status = layout::checkPlacements(meshSizes, group.placements); !status)
      return propagate(status, where + ": " + status.error());
    std::vector<layout::Shape> shapes;
    layout::PackedLayout packed{group.chunk, group.size, {}};
    for (const MemberSpec &member : group.members) {
      if (member.fqns.empty())
        return makeError(where + ": a member has no FQN");
      // Every name a key is made of, the global ones of every expert included.
      for (int64_t e = 0; e < group.expertGroups(); ++e)
        for (size_t f = 0; f < member.fqns.size(); ++f)
          if (std::string fqn = group.memberFQN(member, f, e); !fqns.insert(fqn).second)
            return makeError(where + ": FQN '" + fqn + "' appears twice");
      shapes.push_back(member.shape);
      packed.offsets.push_back(member.offset);
    }
    if (Status status = layout::verifyLayout(shapes, packed, meshSizes, group.placements);
        !status)
      return propagate(status, where + ": " + status.error());
    int64_t shards = layout::numShards(meshSizes, group.placements);
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
        // The longest key of a parameter: optimizer.state.<fqn>.max_exp_avg_sq,
        // with a global expert number of up to 19 digits.
        if (fqn.size() + 64 + (group.experts ? 19 : 0) > limits::kMaxKeyBytes)
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
