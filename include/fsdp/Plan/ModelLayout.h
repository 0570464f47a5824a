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

enum class BufferRole : uint8_t { MainWeight, ModelWeight, MainGrad, ExpAvg, ExpAvgSq };
const char *bufferRoleName(BufferRole role);

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

struct OptimizerSpec {
  bool present = false;
  bool decoupledWeightDecay = false; // AdamW
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weightDecay = 0.0;
  dcp::DType stateDtype = dcp::DType::Float32;
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
