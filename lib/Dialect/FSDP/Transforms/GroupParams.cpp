//===- GroupParams.cpp - Group each unit's parameters ---------------------===//
//
// Megatron-FSDP v2 (`_collect_owned_parameters`, `_group_parameters`): a unit
// owns its own parameters, then its children's, skipping nested units; they
// are split by (dtype, requires_grad) in first-occurrence order.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Dialect/FSDP/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringMap.h"

namespace fsdp {
#define GEN_PASS_DEF_GROUPPARAMS
#include "fsdp/Dialect/FSDP/Transforms/Passes.h.inc"
} // namespace fsdp

using namespace mlir;
using namespace fsdp;

namespace {

/// A member in the making: the storage it stands for and its FQNs.
struct PendingMember {
  ParamOp storage;
  SmallVector<Attribute> fqns;
};

struct PendingGroup {
  Type dtype;
  bool requiresGrad;
  SmallVector<PendingMember> members;
  llvm::DenseMap<Operation *, size_t> memberOfStorage;
};

/// Parameters a unit owns, in named_parameters() order: a module's own
/// parameters first, then each child's, skipping nested units.
static void collectOwnedParams(NNModuleOp module, SmallVectorImpl<ParamOp> &out) {
  for (ParamOp param : module.getBody().getOps<ParamOp>())
    out.push_back(param);
  for (NNModuleOp child : module.getBody().getOps<NNModuleOp>())
    if (!child.getFullyShard())
      collectOwnedParams(child, out);
}

struct GroupParamsPass : public fsdp::impl::GroupParamsBase<GroupParamsPass> {
  void runOnOperation() override {
    ModelOp model = getOperation();
    if (!model.getBody().getOps<ParamGroupOp>().empty()) {
      model.emitError() << "model already has parameter groups; "
                           "fsdp-group-params runs once";
      return signalPassFailure();
    }
    NNModuleOp root = model.getRootModule();
    llvm::StringMap<ParamOp> paramsByFQN;
    root.walk([&](ParamOp param) { paramsByFQN[param.getFQN()] = param; });

    SmallVector<NNModuleOp> units;
    root.walk<WalkOrder::PreOrder>([&](NNModuleOp module) {
      if (module.getFullyShard())
        units.push_back(module);
    });

    OpBuilder builder = OpBuilder::atBlockEnd(&model.getBody().front());
    unsigned groupIndex = 0;
    for (NNModuleOp unit : units) {
      SmallVector<ParamOp> owned;
      collectOwnedParams(unit, owned);
      // Groups keyed by (dtype, requires_grad), in first-occurrence order.
      llvm::MapVector<std::pair<Type, unsigned>, PendingGroup> groups;
      for (ParamOp param : owned) {
        ParamOp storage = param;
        if (std::optional<StringRef> tiedTo = param.getTiedTo())
          storage = paramsByFQN.lookup(*tiedTo);
        Type dtype = storage.getTensorType().getElementType();
        PendingGroup &group = groups[{dtype, unsigned(storage.getRequiresGrad())}];
        group.dtype = dtype;
        group.requiresGrad = storage.getRequiresGrad();
        auto [it, inserted] = group.memberOfStorage.try_emplace(
            storage.getOperation(), group.members.size());
        if (inserted)
          group.members.push_back({storage, {}});
        group.members[it->second].fqns.push_back(
            builder.getStringAttr(param.getFQN()));
      }
      for (auto &entry : groups) {
        PendingGroup &pending = entry.second;
        auto group = ParamGroupOp::create(
            builder, unit.getLoc(),
            builder.getStringAttr("group" + Twine(groupIndex++)),
            builder.getStringAttr(unit.getFQN()), TypeAttr::get(pending.dtype),
            pending.requiresGrad ? UnitAttr() : builder.getUnitAttr(),
            unit.getFullyShardAttr(), IntegerAttr(), IntegerAttr(),
            IntegerAttr(), DenseI64ArrayAttr(), ArrayAttr());
        OpBuilder memberBuilder =
            OpBuilder::atBlockEnd(&group.getBody().emplaceBlock());
        for (PendingMember &member : pending.members)
          MemberOp::create(memberBuilder, member.storage.getLoc(),
                           memberBuilder.getArrayAttr(member.fqns),
                           TypeAttr::get(member.storage.getTensorType()),
                           IntegerAttr(), DenseI64ArrayAttr());
      }
    }
  }
};

} // namespace
