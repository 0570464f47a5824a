//===- FSDPAttrs.h - fsdp dialect attributes and enums ---------*- C++ -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPATTRS_H
#define FSDP_DIALECT_FSDP_IR_FSDPATTRS_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "fsdp/Dialect/FSDP/IR/FSDPEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.h.inc"

namespace fsdp {
/// True for the element types a parameter may have:
/// f64 f32 bf16 f16 i64 i32 i16 i8 ui8 i1.
bool isSupportedElementType(mlir::Type type);
/// True for the floating types usable as main-weight, gradient or
/// optimizer-state dtypes: f64 f32 bf16 f16.
bool isSupportedFloatType(mlir::Type type);
/// The dtype's name in fsdp-model-v1 / fsdp-layout-v1 JSON ("bf16", "u8",
/// "bool", ...); empty for unsupported types.
llvm::StringRef getDTypeName(mlir::Type type);
} // namespace fsdp

#endif // FSDP_DIALECT_FSDP_IR_FSDPATTRS_H
