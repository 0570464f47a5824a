//===- FSDPUtils.h - Helpers for tools that read lowered IR ----*- C++ -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPUTILS_H
#define FSDP_DIALECT_FSDP_IR_FSDPUTILS_H

#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"

namespace fsdp {
/// The single `fsdp.model` in `op` (itself, or a builtin module holding one).
/// Emits an error and returns null otherwise.
ModelOp findModel(mlir::Operation *op);

/// The model's lowered groups; emits an error naming `tool` and returns
/// failure when the model has not been lowered by fsdp-lower-fully-shard.
mlir::FailureOr<llvm::SmallVector<ParamGroupOp>>
getLoweredGroups(ModelOp model, llvm::StringRef tool);
} // namespace fsdp

#endif // FSDP_DIALECT_FSDP_IR_FSDPUTILS_H
