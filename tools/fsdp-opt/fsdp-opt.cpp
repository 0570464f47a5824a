//===- fsdp-opt.cpp - The fsdp optimizer driver ---------------------------===//
#include "fsdp/Tools/Registration.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  fsdp::registerFSDPToolDialects(registry);
  fsdp::registerFSDPToolPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "fsdp optimizer driver\n", registry));
}
