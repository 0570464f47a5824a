//===- Registration.cpp - What fsdp-opt and fsdp-translate register -------===//
#include "fsdp/Tools/Registration.h"
#include "fsdp/Dialect/FSDP/IR/FSDPDialect.h"
#include "fsdp/Dialect/FSDP/Transforms/Passes.h"
#include "fsdp/Import/ModelJSON.h"
#include "fsdp/Target/CheckpointPlan.h"
#include "fsdp/Target/Cpp.h"
#include "fsdp/Target/LayoutJSON.h"
#include "fsdp/Target/LayoutSVG.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"

void fsdp::registerFSDPToolDialects(mlir::DialectRegistry &registry) {
  registry.insert<fsdp::FSDPDialect>();
}

void fsdp::registerFSDPToolPasses() {
  registerFSDPPassesAndPipelines();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
}

void fsdp::registerFSDPToolTranslations() {
  registerImportModelJSONTranslation();
  registerToCheckpointPlanTranslation();
  registerToCppTranslation();
  registerToLayoutJSONTranslation();
  registerToLayoutSVGTranslation();
}
