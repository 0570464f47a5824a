//===- TestModels.h - Small lowered models for the unit tests ---*- C++ -*-===//
//
// Groups packed by the layout library exactly as the lowering packs them,
// so plans built from these models are the plans fsdp-translate emits.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_UNITTESTS_TESTMODELS_H
#define FSDP_UNITTESTS_TESTMODELS_H

#include "fsdp/Layout/Layout.h"
#include "fsdp/Plan/ModelLayout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fsdp {
namespace testmodels {

/// A group packed by the layout library, as the lowering does.
inline plan::GroupSpec makeGroup(const std::string &unit,
                                 std::vector<std::vector<std::string>> fqns,
                                 std::vector<layout::Shape> shapes,
                                 const std::vector<int64_t> &mesh,
                                 std::vector<layout::Placement> placements, bool trainable = true,
                                 dcp::DType dtype = dcp::DType::BFloat16) {
  using plan::BufferRole;
  plan::GroupSpec group;
  group.unit = unit;
  group.dtype = dtype;
  group.requiresGrad = trainable;
  group.placements = std::move(placements);
  Result<layout::PackedLayout> packed = layout::packGroup(shapes, layout::meshSize(mesh));
  EXPECT_TRUE(packed.ok());
  group.chunk = packed->chunk;
  group.size = packed->size;
  group.shardSize = packed->size / layout::numShards(mesh, group.placements);
  group.buffers = {{BufferRole::MainWeight, dcp::DType::Float32, false},
                   {BufferRole::ModelWeight, dtype, dtype == dcp::DType::Float32}};
  if (trainable)
    group.buffers.insert(group.buffers.end(), {{BufferRole::MainGrad, dtype, false},
                                               {BufferRole::ExpAvg, dcp::DType::Float32, false},
                                               {BufferRole::ExpAvgSq, dcp::DType::Float32, false}});
  for (size_t i = 0; i < shapes.size(); ++i)
    group.members.push_back({fqns[i], shapes[i], packed->offsets[i]});
  return group;
}

/// The worked example: p0 [5,3], p1 [7], p2 [4,4] in one bf16 unit.
inline plan::ModelLayout workedExample(std::vector<int64_t> mesh = {4},
                                       std::vector<layout::Placement> placements = {
                                           layout::Placement::Shard}) {
  plan::ModelLayout model;
  for (size_t i = 0; i < mesh.size(); ++i)
    model.meshAxisNames.push_back("a" + std::to_string(i));
  model.meshSizes = mesh;
  model.optimizer.present = true;
  model.optimizer.kind = plan::OptimizerKind::AdamW;
  model.optimizer.weightDecay = 0.01;
  model.groups.push_back(
      makeGroup("", {{"p0"}, {"p1"}, {"p2"}}, {{5, 3}, {7}, {4, 4}}, mesh, placements));
  model.optimizerParams = {"p0", "p1", "p2"};
  return model;
}

/// A toy MoE on a world of 4: a dense unit on the world, and an experts
/// unit (grouped names, `perRank` local experts of fc1 [7, 6] and fc2
/// [5, 7]) on the view `view` whose last axis is expert parallelism.
inline plan::ModelLayout moeExample(std::vector<int64_t> view = {2, 2}, int64_t perRank = 2,
                                    std::vector<layout::Placement> placements = {
                                        layout::Placement::Shard}) {
  plan::ModelLayout model;
  model.meshAxisNames = {"dp"};
  model.meshSizes = {layout::meshSize(view)};
  model.optimizer.present = true;
  model.optimizer.kind = plan::OptimizerKind::AdamW;
  model.groups.push_back(makeGroup("", {{"embed"}, {"router"}}, {{11, 6}, {4, 6}},
                                   model.meshSizes, {layout::Placement::Shard}));
  layout::ExpertMesh mesh{view, static_cast<int64_t>(view.size()) - 1};
  std::vector<std::vector<std::string>> fqns;
  std::vector<layout::Shape> shapes;
  for (const char *stem : {"experts.fc1.weight", "experts.fc2.weight"})
    for (int64_t i = 0; i < perRank; ++i) {
      fqns.push_back({stem + std::to_string(i)});
      shapes.push_back(std::string(stem).find("fc1") != std::string::npos
                           ? layout::Shape{7, 6}
                           : layout::Shape{5, 7});
    }
  plan::GroupSpec experts = makeGroup("experts", fqns, shapes, mesh.meshSizes(), placements);
  experts.experts = plan::ExpertGroupSpec{mesh, perRank, layout::ExpertNaming::Grouped};
  for (plan::MemberSpec &member : experts.members)
    member.expert =
        layout::splitExpertFQN(member.fqns.front(), "experts", layout::ExpertNaming::Grouped);
  model.groups.push_back(std::move(experts));
  model.optimizerParams = {"embed", "router"};
  for (const std::vector<std::string> &fqn : fqns)
    model.optimizerParams.push_back(fqn.front());
  return model;
}

} // namespace testmodels
} // namespace fsdp

#endif // FSDP_UNITTESTS_TESTMODELS_H
