//===- FSDPOps.h - fsdp dialect operations ---------------------*- C++ -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPOPS_H
#define FSDP_DIALECT_FSDP_IR_FSDPOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"

#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.h"
#include "fsdp/Dialect/FSDP/IR/FSDPDialect.h"

#include "fsdp/Layout/Layout.h"
#include "llvm/ADT/StringMap.h"

#include <optional>

namespace fsdp {
class MeshOp;
class ExpertMeshOp;
class OptimizerOp;
class NNModuleOp;
} // namespace fsdp

#define GET_OP_CLASSES
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h.inc"

namespace fsdp {
/// The mesh and placements in the layout library's terms (the one source of
/// truth for the layout math).
std::vector<int64_t> getLayoutMeshSizes(MeshOp mesh);
std::vector<layout::Placement> getLayoutPlacements(FullyShardAttr policy);

/// The mesh a unit's placements apply to: the world's, or for the experts of
/// a mixture-of-experts layer their expert mesh without its expert axis
/// (docs/Experts.md). World ranks map to ranks of that mesh.
struct UnitMesh {
  std::vector<int64_t> meshSizes;
  std::optional<layout::ExpertMesh> experts;
  /// A world rank's flat rank in meshSizes.
  int64_t meshRank(int64_t worldRank) const {
    return experts ? experts->meshRank(worldRank) : worldRank;
  }
};
/// The unit's mesh; the world's when its expert mesh does not resolve (the
/// verifier reports that).
UnitMesh getUnitMesh(NNModuleOp unit);
/// The fully_shard unit a group names, or null.
NNModuleOp findUnit(ModelOp model, llvm::StringRef fqn);
/// The mesh of the group's unit (the world's when the unit is not found).
UnitMesh getGroupMesh(ParamGroupOp group);

/// Shapes of a group's members, in member order.
std::vector<layout::Shape> getMemberShapes(ParamGroupOp group);

/// The parameter groups of one fully_shard unit, as Megatron-FSDP v2 forms
/// them (`_collect_owned_parameters`, `_group_parameters`): the unit's own
/// parameters, then its children's, skipping nested units; split by (dtype,
/// requires_grad) in first-occurrence order; a tied parameter is one member
/// under its first FQN, carrying all its FQNs. The fsdp-group-params pass
/// builds these and the verifier checks groups against them.
struct UnitGroupMember {
  ParamOp storage;
  llvm::SmallVector<std::string, 1> fqns;
};
struct UnitGroup {
  mlir::Type dtype;
  bool requiresGrad = true;
  llvm::SmallVector<UnitGroupMember> members;
};
llvm::SmallVector<UnitGroup> computeUnitGroups(NNModuleOp unit,
                                               const llvm::StringMap<ParamOp> &paramsByFQN);

/// The buffers of a group (docs/MegatronFSDPLayout.md): main weights in the
/// policy's dtype (integer parameters keep theirs: a cast would lose them),
/// model weights in the parameter dtype, aliasing main weights when equal;
/// trainable groups add main grads and, with an optimizer, its two moments.
mlir::ArrayAttr getExpectedBuffers(ParamGroupOp group, OptimizerOp optimizer);
} // namespace fsdp

#endif // FSDP_DIALECT_FSDP_IR_FSDPOPS_H
