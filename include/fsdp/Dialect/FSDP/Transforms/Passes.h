//===- Passes.h - fsdp lowering passes -------------------------*- C++ -*-===//
#ifndef FSDP_DIALECT_FSDP_TRANSFORMS_PASSES_H
#define FSDP_DIALECT_FSDP_TRANSFORMS_PASSES_H

#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

namespace fsdp {

#define GEN_PASS_DECL
#include "fsdp/Dialect/FSDP/Transforms/Passes.h.inc"

/// Options of the `fsdp-lower-fully-shard` pipeline.
struct LowerFullyShardOptions
    : public mlir::PassPipelineOptions<LowerFullyShardOptions> {
  Option<bool> reportCanonicalMismatch{
      *this, "report-canonical-mismatch",
      llvm::cl::desc("Remark on every parameter whose pieces differ from "
                     "canonical Shard(0)"),
      llvm::cl::init(false)};
};

/// The whole lowering: group, pack, assign rank ranges, verify.
void buildLowerFullyShardPipeline(mlir::OpPassManager &pm,
                                  const LowerFullyShardOptions &options);

/// Registers every pass and the `fsdp-lower-fully-shard` pipeline.
void registerFSDPPassesAndPipelines();

#define GEN_PASS_REGISTRATION
#include "fsdp/Dialect/FSDP/Transforms/Passes.h.inc"

} // namespace fsdp

#endif // FSDP_DIALECT_FSDP_TRANSFORMS_PASSES_H
