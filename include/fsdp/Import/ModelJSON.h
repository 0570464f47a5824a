//===- ModelJSON.h - Import fsdp-model-v1 JSON into the fsdp dialect -*- C++ -*-===//
#ifndef FSDP_IMPORT_MODELJSON_H
#define FSDP_IMPORT_MODELJSON_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/StringRef.h"

#include <string>

namespace fsdp {

struct ModelJSONImportOptions {
  /// "NAME=SIZE[,NAME=SIZE...]": replaces the JSON's mesh when non-empty.
  std::string meshOverride;
  /// "shard|replicate[,...]": replaces every unit's placements when non-empty.
  std::string placementsOverride;
};

/// Parses an `fsdp-model-v1` description (docs/ModelDescription.md) into a
/// builtin module holding one verified `fsdp.model`. On error, emits one
/// diagnostic naming `fileName` and the JSON path at fault and returns null.
mlir::OwningOpRef<mlir::ModuleOp> importModelJSON(llvm::StringRef json, llvm::StringRef fileName,
                                                  mlir::MLIRContext *context,
                                                  const ModelJSONImportOptions &options = {});

/// Registers `--import-model-json` (with `--mesh` and `--placements`) for
/// fsdp-translate.
void registerImportModelJSONTranslation();

} // namespace fsdp

#endif // FSDP_IMPORT_MODELJSON_H
