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

#include "fsdp/Layout/Layout.h"

namespace fsdp {
/// The mesh and placements in the layout library's terms (the one source of
/// truth for the layout math).
std::vector<int64_t> getLayoutMeshSizes(MeshOp mesh);
std::vector<layout::Placement> getLayoutPlacements(FullyShardAttr policy);
/// Shapes of a group's members, in member order.
std::vector<layout::Shape> getMemberShapes(ParamGroupOp group);
} // namespace fsdp

#endif // FSDP_DIALECT_FSDP_IR_FSDPOPS_H
