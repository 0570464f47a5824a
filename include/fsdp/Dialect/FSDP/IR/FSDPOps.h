//===- FSDPOps.h - fsdp dialect operations ---------------------*- C++ -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPOPS_H
#define FSDP_DIALECT_FSDP_IR_FSDPOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"

#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.h"
#include "fsdp/Dialect/FSDP/IR/FSDPDialect.h"

namespace fsdp {
class MeshOp;
class OptimizerOp;
class NNModuleOp;
} // namespace fsdp

#define GET_OP_CLASSES
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h.inc"

#endif // FSDP_DIALECT_FSDP_IR_FSDPOPS_H
