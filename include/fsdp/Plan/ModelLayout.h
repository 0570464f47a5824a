//===- ModelLayout.h - A lowered model in plain C++ terms -------*- C++ -*-===//
//
// What checkpoint planning needs to know about a lowered model, without MLIR:
// the mesh, the optimizer, and every parameter group with its packed layout.
// The translation fills it from the IR; tests and tools can fill it directly.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_PLAN_MODELLAYOUT_H
#define FSDP_PLAN_MODELLAYOUT_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Layout/Layout.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {
namespace plan {

enum class BufferRole : uint8_t {
  MainWeight,
  ModelWeight,
  MainGrad,
  ExpAvg,
  ExpAvgSq,
  MaxExpAvgSq,
  MomentumBuffer,
};
constexpr BufferRole kLastBufferRole = BufferRole::MomentumBuffer;
const char *bufferRoleName(BufferRole role);
/// Whether a role is optimizer state (saved as `optimizer.state.<fqn>.<role>`).
bool isOptimizerStateRole(BufferRole role);

struct BufferSpec {
  BufferRole role = BufferRole::MainWeight;
  dcp::DType dtype = dcp::DType::Float32;
  bool aliasesMainWeight = false;
};

/// One physical tensor of a group: every FQN that names it (first leads).
struct MemberSpec {
  std::vector<std::string> fqns;
  layout::Shape shape;
  int64_t offset = 0;
  /// In an experts group: the (single, untied) FQN split around its local
  /// expert number; its checkpoint keys carry the global number instead.
  std::optional<layout::ExpertName> expert;
};

/// An experts group (docs/Experts.md): sharded on the experts' mesh, each
/// expert-parallel coordinate holding its own experts in the same layout.
struct ExpertGroupSpec {
  layout::ExpertMesh mesh;
  /// Experts a rank holds: the count over the expert-parallel size.
  int64_t perRank = 1;
  layout::ExpertNaming naming = layout::ExpertNaming::Grouped;
};

struct GroupSpec {
  std::string unit;
  dcp::DType dtype = dcp::DType::Float32;
  bool requiresGrad = true;
  std::vector<layout::Placement> placements;
  int64_t chunk = 1;
  int64_t size = 0;
  int64_t shardSize = 0;
  std::vector<BufferSpec> buffers;
  std::vector<MemberSpec> members;
  std::optional<ExpertGroupSpec> experts;

  const BufferSpec *findBuffer(BufferRole role) const;
  /// Expert-parallel coordinates: 1 for a group without experts.
  int64_t expertGroups() const { return experts ? experts->mesh.expertGroups() : 1; }
  /// The FQN `fqn` of `member` names on expert-parallel coordinate
  /// `expertCoord`: itself, or with its global expert number.
  std::string memberFQN(const MemberSpec &member, size_t fqn, int64_t expertCoord) const;
};

enum class OptimizerKind : uint8_t { Adam, AdamW, SGD };
/// "adam", "adamw", "sgd": the model description's names.
const char *optimizerKindName(OptimizerKind kind);

struct OptimizerSpec {
  bool present = false;
  OptimizerKind kind = OptimizerKind::Adam;
  double lr = 1e-3;
  double weightDecay = 0.0;
  // Adam / AdamW.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool amsgrad = false;
  // SGD.
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  dcp::DType stateDtype = dcp::DType::Float32;
  /// The per-parameter state tensors, in torch's order; every trainable group
  /// has a buffer for each (the IR's OptimizerOp::getStateTensors decides them).
  std::vector<BufferRole> stateRoles = {BufferRole::ExpAvg, BufferRole::ExpAvgSq};
  /// Whether every parameter also has a scalar `step` (Adam, AdamW).
  bool hasStep = true;
};

struct ModelLayout {
  std::vector<std::string> meshAxisNames;
  std::vector<int64_t> meshSizes;
  OptimizerSpec optimizer;
  std::vector<GroupSpec> groups;
  /// Trainable parameters' leading FQNs in named_parameters() order: the
  /// optimizer's `params` list.
  std::vector<std::string> optimizerParams;

  int64_t worldSize() const { return layout::meshSize(meshSizes); }
  /// The mesh a group is sharded on: the world's, or its experts' mesh.
  std::vector<int64_t> groupMeshSizes(const GroupSpec &group) const {
    return group.experts ? group.experts->mesh.meshSizes() : meshSizes;
  }
};

/// Which shard of `group` each world rank holds. A shard of an experts group
/// is numbered expertCoord * (its mesh's shards) + its shard in that mesh, so
/// ranks of different expert-parallel groups never share one.
std::vector<int64_t> groupShardOfRank(const ModelLayout &model, const GroupSpec &group);
/// Shards of `group` in all: its mesh's shards times its expert groups.
int64_t groupShardCount(const ModelLayout &model, const GroupSpec &group);

/// Checks what planning relies on (mesh, placements, every group's layout
/// via layout::verifyLayout, buffers present): plans are only built from
/// verified layouts.
Status checkModelLayout(const ModelLayout &model);

} // namespace plan
} // namespace fsdp

#endif // FSDP_PLAN_MODELLAYOUT_H
