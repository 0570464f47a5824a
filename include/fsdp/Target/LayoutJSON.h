//===- LayoutJSON.h - Emit fsdp-layout-v1 JSON -----------------*- C++ -*-===//
#ifndef FSDP_TARGET_LAYOUTJSON_H
#define FSDP_TARGET_LAYOUTJSON_H

#include "mlir/Support/LLVM.h"

namespace mlir {
class Operation;
} // namespace mlir

namespace fsdp {
/// Writes the layout of the lowered `fsdp.model` in `op` (the model or a
/// builtin module holding exactly one) as fsdp-layout-v1 JSON
/// (docs/LayoutJSON.md).
mlir::LogicalResult translateToLayoutJSON(mlir::Operation *op, llvm::raw_ostream &os);
/// Registers `--emit-layout-json` for fsdp-translate.
void registerToLayoutJSONTranslation();
} // namespace fsdp

#endif // FSDP_TARGET_LAYOUTJSON_H
