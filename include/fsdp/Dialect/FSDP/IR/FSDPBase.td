//===- FSDPBase.td - The fsdp dialect and its enums --------*- tablegen -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPBASE_TD
#define FSDP_DIALECT_FSDP_IR_FSDPBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def FSDP_Dialect : Dialect {
  let name = "fsdp";
  let cppNamespace = "::fsdp";
  let summary = "Fully sharded data parallelism: meshes, module trees, packed layouts";
  let description = [{
    The `fsdp` dialect describes a model as FSDP sees it: a device mesh, a tree of
    modules holding parameters, `fully_shard` units with placements and a
    mixed-precision policy, and an optimizer. Lowering turns each unit into
    Megatron-FSDP packed parameter-group buffers whose per-rank offsets are
    explicit, verified attributes, from which checkpoint plans are emitted.
  }];
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    /// Defined next to the attribute storage classes (FSDPAttrs.cpp).
    void registerAttributes();
  }];
}

def FSDP_Placement : I32EnumAttr<"Placement", "placement of a buffer on one mesh axis", [
    I32EnumAttrCase<"Replicate", 0, "replicate">,
    I32EnumAttrCase<"Shard", 1, "shard">
  ]> {
  let cppNamespace = "::fsdp";
  let genSpecializedAttr = 0;
}

def FSDP_OptimizerKindAttr : I32EnumAttr<"OptimizerKind", "optimizer algorithm", [
    I32EnumAttrCase<"Adam", 0, "adam">,
    I32EnumAttrCase<"AdamW", 1, "adamw">,
    I32EnumAttrCase<"SGD", 2, "sgd">
  ]> {
  let cppNamespace = "::fsdp";
}

def FSDP_BufferRole : I32EnumAttr<"BufferRole", "role of a packed parameter-group buffer", [
    I32EnumAttrCase<"MainWeight", 0, "main_weight">,
    I32EnumAttrCase<"ModelWeight", 1, "model_weight">,
    I32EnumAttrCase<"MainGrad", 2, "main_grad">,
    I32EnumAttrCase<"ExpAvg", 3, "exp_avg">,
    I32EnumAttrCase<"ExpAvgSq", 4, "exp_avg_sq">,
    I32EnumAttrCase<"MaxExpAvgSq", 5, "max_exp_avg_sq">,
    I32EnumAttrCase<"MomentumBuffer", 6, "momentum_buffer">
  ]> {
  let cppNamespace = "::fsdp";
  let genSpecializedAttr = 0;
}

def FSDP_ExpertNaming : I32EnumAttr<"ExpertNaming", "how local experts are named", [
    I32EnumAttrCase<"Grouped", 0, "grouped">,
    I32EnumAttrCase<"LocalExperts", 1, "local_experts">
  ]> {
  let cppNamespace = "::fsdp";
  let genSpecializedAttr = 0;
}

def FSDP_BufferRoleAttr : EnumAttr<FSDP_Dialect, FSDP_BufferRole, "buffer_role">;

#endif // FSDP_DIALECT_FSDP_IR_FSDPBASE_TD
