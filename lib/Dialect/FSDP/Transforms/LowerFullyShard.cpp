//===- LowerFullyShard.cpp - The fsdp-lower-fully-shard pipeline ----------===//
#include "fsdp/Dialect/FSDP/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;
using namespace fsdp;

void fsdp::buildLowerFullyShardPipeline(OpPassManager &pm,
                                        const LowerFullyShardOptions &options) {
  OpPassManager &modelPM = pm.nest<ModelOp>();
  modelPM.addPass(createGroupParams());
  modelPM.addPass(createPackParamGroups());
  modelPM.addPass(createAssignRankRanges());
  VerifyLayoutOptions verifyOptions;
  verifyOptions.reportCanonicalMismatch = options.reportCanonicalMismatch;
  modelPM.addPass(createVerifyLayout(verifyOptions));
}

void fsdp::registerFSDPPassesAndPipelines() {
  registerFSDPPasses();
  PassPipelineRegistration<LowerFullyShardOptions>(
      "fsdp-lower-fully-shard",
      "Lower fully_shard units into verified Megatron-FSDP packed layouts "
      "(group, pack, assign rank ranges, verify)",
      buildLowerFullyShardPipeline);
}
