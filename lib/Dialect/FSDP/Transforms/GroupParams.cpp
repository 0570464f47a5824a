//===- GroupParams.cpp - Group each unit's parameters ---------------------===//
//
// Creates one fsdp.param_group per group computeUnitGroups forms (Megatron-
// FSDP v2's `_collect_owned_parameters` and `_group_parameters`).
//
//===----------------------------------------------------------------------===//
#include "fsdp/Dialect/FSDP/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringMap.h"

namespace fsdp {
#define GEN_PASS_DEF_GROUPPARAMS
#include "fsdp/Dialect/FSDP/Transforms/Passes.h.inc"
} // namespace fsdp

using namespace mlir;
using namespace fsdp;

namespace {

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
      for (UnitGroup &pending : computeUnitGroups(unit, paramsByFQN)) {
        auto group = ParamGroupOp::create(
            builder, unit.getLoc(),
            builder.getStringAttr("group" + Twine(groupIndex++)),
            builder.getStringAttr(unit.getFQN()), TypeAttr::get(pending.dtype),
            pending.requiresGrad ? UnitAttr() : builder.getUnitAttr(),
            unit.getFullyShardAttr(), IntegerAttr(), IntegerAttr(),
            IntegerAttr(), DenseI64ArrayAttr(), ArrayAttr());
        OpBuilder memberBuilder =
            OpBuilder::atBlockEnd(&group.getBody().emplaceBlock());
        for (UnitGroupMember &member : pending.members) {
          SmallVector<Attribute> fqns;
          for (const std::string &fqn : member.fqns)
            fqns.push_back(memberBuilder.getStringAttr(fqn));
          MemberOp::create(memberBuilder, member.storage.getLoc(),
                           memberBuilder.getArrayAttr(fqns),
                           TypeAttr::get(member.storage.getTensorType()),
                           IntegerAttr(), DenseI64ArrayAttr());
        }
      }
    }
  }
};

} // namespace
