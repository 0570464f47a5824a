//===- fsdp-translate.cpp - The fsdp translation driver -------------------===//
#include "fsdp/Tools/Registration.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  fsdp::registerFSDPToolTranslations();
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "fsdp translation driver\n"));
}
