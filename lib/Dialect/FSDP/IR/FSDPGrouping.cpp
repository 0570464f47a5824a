//===- FSDPGrouping.cpp - grouping analysis and the layout bridge ---------===//
//
// What the passes build and the verifiers check against: a unit's parameter
// groups and a group's buffers as Megatron-FSDP forms them, and the mesh,
// placements and shapes in the layout library's terms.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"

#include "llvm/ADT/DenseMap.h"

using namespace mlir;
using namespace fsdp;

//===----------------------------------------------------------------------===//
// Layout library bridge
//===----------------------------------------------------------------------===//

std::vector<int64_t> fsdp::getLayoutMeshSizes(MeshOp mesh) {
  return std::vector<int64_t>(mesh.getShape().begin(), mesh.getShape().end());
}

std::vector<layout::Placement> fsdp::getLayoutPlacements(FullyShardAttr policy) {
  std::vector<layout::Placement> placements;
  for (Placement placement : policy.getPlacements())
    placements.push_back(placement == Placement::Shard
                             ? layout::Placement::Shard
                             : layout::Placement::Replicate);
  return placements;
}

UnitMesh fsdp::getUnitMesh(NNModuleOp unit) {
  UnitMesh mesh;
  auto model = unit->getParentOfType<ModelOp>();
  if (model && model.getMesh())
    mesh.meshSizes = getLayoutMeshSizes(model.getMesh());
  ExpertMeshOp experts = unit.getExpertMesh();
  if (!experts || !model || !model.getMesh())
    return mesh;
  layout::ExpertMesh view = experts.getLayoutMesh();
  // Only a view the world's ranks fill is used; the verifier reports others.
  if (!layout::checkExpertMesh(view, layout::meshSize(mesh.meshSizes)))
    return mesh;
  mesh.meshSizes = view.meshSizes();
  mesh.experts = std::move(view);
  return mesh;
}

NNModuleOp fsdp::findUnit(ModelOp model, StringRef fqn) {
  NNModuleOp found;
  if (NNModuleOp root = model ? model.getRootModule() : NNModuleOp())
    root.walk([&](NNModuleOp module) {
      if (module.getFullyShard() && module.getFQN() == fqn) {
        found = module;
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
  return found;
}

UnitMesh fsdp::getGroupMesh(ParamGroupOp group) {
  auto model = group->getParentOfType<ModelOp>();
  if (NNModuleOp unit = findUnit(model, group.getUnit()))
    return getUnitMesh(unit);
  UnitMesh mesh;
  if (model && model.getMesh())
    mesh.meshSizes = getLayoutMeshSizes(model.getMesh());
  return mesh;
}

std::vector<layout::Shape> fsdp::getMemberShapes(ParamGroupOp group) {
  std::vector<layout::Shape> shapes;
  for (MemberOp member : group.getBody().getOps<MemberOp>()) {
    ArrayRef<int64_t> shape = member.getTensorType().getShape();
    shapes.emplace_back(shape.begin(), shape.end());
  }
  return shapes;
}

//===----------------------------------------------------------------------===//
// Grouping and buffers: one source of truth for the passes and the verifier
//===----------------------------------------------------------------------===//

/// Parameters a unit owns, in named_parameters() order.
static void collectOwnedParams(NNModuleOp module, SmallVectorImpl<ParamOp> &out) {
  for (ParamOp param : module.getBody().getOps<ParamOp>())
    out.push_back(param);
  for (NNModuleOp child : module.getBody().getOps<NNModuleOp>())
    if (!child.getFullyShard())
      collectOwnedParams(child, out);
}

SmallVector<UnitGroup> fsdp::computeUnitGroups(NNModuleOp unit,
                                               const llvm::StringMap<ParamOp> &paramsByFQN) {
  SmallVector<ParamOp> owned;
  collectOwnedParams(unit, owned);
  SmallVector<UnitGroup> groups;
  llvm::DenseMap<std::pair<Type, unsigned>, size_t> groupOf;
  llvm::DenseMap<Operation *, std::pair<size_t, size_t>> memberOf;
  for (ParamOp param : owned) {
    ParamOp storage = param;
    if (std::optional<StringRef> tiedTo = param.getTiedTo())
      if (ParamOp target = paramsByFQN.lookup(*tiedTo))
        storage = target;
    Type dtype = storage.getTensorType().getElementType();
    auto key = std::make_pair(dtype, unsigned(storage.getRequiresGrad()));
    auto [groupIt, newGroup] = groupOf.try_emplace(key, groups.size());
    if (newGroup)
      groups.push_back({dtype, storage.getRequiresGrad(), {}});
    UnitGroup &group = groups[groupIt->second];
    auto [memberIt, newMember] = memberOf.try_emplace(
        storage.getOperation(), std::make_pair(groupIt->second, group.members.size()));
    if (newMember)
      group.members.push_back({storage, {}});
    groups[memberIt->second.first].members[memberIt->second.second].fqns.push_back(param.getFQN());
  }
  return groups;
}

ArrayAttr fsdp::getExpectedBuffers(ParamGroupOp group, OptimizerOp optimizer) {
  MLIRContext *context = group.getContext();
  Type dtype = group.getDtype();
  FullyShardAttr policy = group.getPolicy();
  Type mainWeight = isSupportedFloatType(dtype) ? policy.getMainParams() : dtype;
  SmallVector<Attribute> buffers = {
      BufferAttr::get(context, BufferRole::MainWeight, mainWeight, false),
      BufferAttr::get(context, BufferRole::ModelWeight, dtype, mainWeight == dtype)};
  if (group.getRequiresGrad()) {
    Type grad = policy.getMainGrads() ? policy.getMainGrads() : dtype;
    buffers.push_back(BufferAttr::get(context, BufferRole::MainGrad, grad, false));
    if (optimizer) {
      Type state = optimizer.getState();
      for (BufferRole role : optimizer.getStateTensors())
        buffers.push_back(BufferAttr::get(context, role, state, false));
    }
  }
  return ArrayAttr::get(context, buffers);
}
