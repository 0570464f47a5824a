//===- FSDPDialect.cpp - The fsdp dialect ---------------------------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPDialect.h"
#include "fsdp/Dialect/FSDP/IR/FSDPAttrs.h"
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace fsdp;

#include "fsdp/Dialect/FSDP/IR/FSDPDialect.cpp.inc"

void FSDPDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "fsdp/Dialect/FSDP/IR/FSDPOps.cpp.inc"
      >();
  registerAttributes();
}
