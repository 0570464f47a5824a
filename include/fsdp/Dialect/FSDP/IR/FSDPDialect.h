//===- FSDPDialect.h - The fsdp dialect ------------------------*- C++ -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPDIALECT_H
#define FSDP_DIALECT_FSDP_IR_FSDPDIALECT_H

#include "mlir/IR/Dialect.h"

#include "fsdp/Dialect/FSDP/IR/FSDPDialect.h.inc"

#endif // FSDP_DIALECT_FSDP_IR_FSDPDIALECT_H
