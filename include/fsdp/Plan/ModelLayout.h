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

  const BufferSpec *findBuffer(BufferRole role) const;
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
};

/// Checks what planning relies on (mesh, placements, every group's layout
/// via layout::verifyLayout, buffers present): plans are only built from
/// verified layouts.
Status checkModelLayout(const ModelLayout &model);

} // namespace plan
} // namespace fsdp

#endif // FSDP_PLAN_MODELLAYOUT_H
