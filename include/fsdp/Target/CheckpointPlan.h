//===- CheckpointPlan.h - Emit checkpoint plans from lowered IR -*- C++ -*-===//
#ifndef FSDP_TARGET_CHECKPOINTPLAN_H
#define FSDP_TARGET_CHECKPOINTPLAN_H

#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"
#include "fsdp/Plan/ModelLayout.h"

namespace fsdp {
/// The lowered model in the plan library's terms (no MLIR past this point).
mlir::FailureOr<plan::ModelLayout> buildModelLayout(ModelOp model);

/// Registers `--emit-checkpoint-plan` (with `--plan-ranks` and
/// `--plan-format=flatbuffers|json`) for fsdp-translate.
void registerToCheckpointPlanTranslation();
} // namespace fsdp

#endif // FSDP_TARGET_CHECKPOINTPLAN_H
