//===- FSDPAttrs.h - fsdp dialect attributes and enums ---------*- C++ -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPATTRS_H
#define FSDP_DIALECT_FSDP_IR_FSDPATTRS_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "fsdp/Format/DcpMetadata.h"

#include <optional>
#include <string>

#include "fsdp/Dialect/FSDP/IR/FSDPEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.h.inc"

namespace fsdp {
//===----------------------------------------------------------------------===//
// Dtypes: one table (FSDPDTypes.cpp) over the checkpoint format's dcp::DType,
// which gives the PyTorch name and the element size.
//===----------------------------------------------------------------------===//

/// True for the element types a parameter may have:
/// f64 f32 bf16 f16 i64 i32 i16 i8 ui8 i1.
bool isSupportedElementType(mlir::Type type);
/// True for the floating types usable as main-weight, gradient or
/// optimizer-state dtypes: f64 f32 bf16 f16.
bool isSupportedFloatType(mlir::Type type);
/// The dtype's name in fsdp-model-v1 / fsdp-layout-v1 JSON ("bf16", "u8",
/// "bool", ...); empty for unsupported types.
llvm::StringRef getDTypeName(mlir::Type type);
/// The same name for a checkpoint dtype; empty for one no IR type maps to.
llvm::StringRef getDTypeName(dcp::DType dtype);
/// The checkpoint dtype of a supported element type.
std::optional<dcp::DType> getCheckpointDType(mlir::Type type);
/// The element type named `name`: a JSON name ("bf16"), a PyTorch name
/// ("bfloat16", "torch.bfloat16") or a PyTorch alias ("half", "long");
/// null if none.
mlir::Type parseDTypeName(mlir::MLIRContext *context, llvm::StringRef name);
/// The supported types as the IR spells them, joined by ", "
/// ("f64, f32, ..."), the floating ones only when `floatsOnly`.
std::string getSupportedTypesText(bool floatsOnly);
/// The JSON names of the supported dtypes, joined by `separator`.
std::string getSupportedDTypeNames(llvm::StringRef separator = " ");
} // namespace fsdp

#endif // FSDP_DIALECT_FSDP_IR_FSDPATTRS_H
