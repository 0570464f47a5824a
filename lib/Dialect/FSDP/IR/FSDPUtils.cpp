//===- FSDPUtils.cpp - Helpers for tools that read lowered IR -------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPUtils.h"

#include "mlir/IR/BuiltinOps.h"

using namespace mlir;
using namespace fsdp;

ModelOp fsdp::findModel(Operation *op) {
  if (auto model = dyn_cast<ModelOp>(op))
    return model;
  SmallVector<ModelOp> models;
  if (auto module = dyn_cast<ModuleOp>(op))
    models = llvm::to_vector(module.getBody()->getOps<ModelOp>());
  if (models.size() != 1) {
    // Location-only diagnostics: a dump of the whole model helps nobody.
    mlir::emitError(op->getLoc())
        << "expected exactly one 'fsdp.model', found " << models.size();
    return {};
  }
  return models.front();
}

FailureOr<SmallVector<ParamGroupOp>> fsdp::getLoweredGroups(ModelOp model,
                                                            StringRef tool) {
  SmallVector<ParamGroupOp> groups =
      llvm::to_vector(model.getBody().getOps<ParamGroupOp>());
  // A model whose units own no parameter lowers to no group at all.
  bool ownsParams = false;
  model.getRootModule().walk([&](ParamOp param) {
    ownsParams |= static_cast<bool>(
        cast<NNModuleOp>(param->getParentOp()).getOwningUnit());
  });
  bool lowered = !groups.empty() || !ownsParams;
  for (ParamGroupOp group : groups)
    lowered &= group.getChunk() && group.getRanks() && group.getBuffers();
  if (!lowered)
    return mlir::emitError(model.getLoc())
           << tool << " needs a lowered model; run fsdp-opt "
                      "--fsdp-lower-fully-shard first";
  return groups;
}
