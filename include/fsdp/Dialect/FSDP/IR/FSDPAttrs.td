//===- FSDPAttrs.td - fsdp dialect attributes --------------*- tablegen -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPATTRS_TD
#define FSDP_DIALECT_FSDP_IR_FSDPATTRS_TD

include "fsdp/Dialect/FSDP/IR/FSDPBase.td"

class FSDP_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<FSDP_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def FSDP_FullyShardAttr : FSDP_Attr<"FullyShard", "fully_shard"> {
  let summary = "a fully_shard unit: placements per mesh axis and mixed precision";
  let description = [{
    Marks a module as a `fully_shard` unit. `placements` has one entry per
    mesh axis; the `shard` axes form a suffix (`[shard]` is FSDP,
    `[replicate, shard]` HSDP, `[shard, shard]` HFSDP). These are the
    main-weight and optimizer-state placements, which is what a checkpoint
    sees. `main_params` is the dtype of the main (optimizer) weights;
    `main_grads`, when present, the dtype of the main gradients (otherwise
    each parameter's own dtype).

    ```mlir
    #fsdp.fully_shard<[replicate, shard], main_params = f32, main_grads = bf16>
    ```
  }];
  let parameters = (ins
    ArrayRefParameter<"::fsdp::Placement", "one placement per mesh axis">:$placements,
    "::mlir::Type":$mainParams,
    OptionalParameter<"::mlir::Type">:$mainGrads);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

def FSDP_ExpertsAttr : FSDP_Attr<"Experts", "experts"> {
  let summary = "a module of experts: its expert mesh, expert count and naming";
  let description = [{
    Marks a `fully_shard` unit as the experts of a mixture-of-experts layer
    (docs/Experts.md). `mesh` names an `fsdp.expert_mesh`: the unit's
    placements are those of the view's axes without the expert axis, and
    the expert-parallel coordinate selects the `count / (expert axis size)`
    experts a rank holds. The module's parameters are those of one rank,
    under local names: `grouped` names each parameter `<stem><i>` for local
    expert `i` (Megatron-Core's grouped GEMM, `weight0`, `weight1`, ...);
    `local_experts` puts each local expert's parameters under the child
    `local_experts.<i>`. Checkpoint keys carry the global number
    `i + coordinate * (experts per rank)`.

    ```mlir
    #fsdp.experts<@experts, count = 8, grouped>
    ```
  }];
  let parameters = (ins "::mlir::FlatSymbolRefAttr":$mesh, "int64_t":$count,
                        EnumParameter<FSDP_ExpertNaming>:$naming);
  let assemblyFormat = "`<` $mesh `,` `count` `=` $count `,` $naming `>`";
}

def FSDP_BufferAttr : FSDP_Attr<"Buffer", "buffer"> {
  let summary = "one packed buffer of a parameter group: its role and dtype";
  let description = [{
    All buffers of a group share the group's packed layout (the same element
    offsets); only the element type differs. `model_weight` aliases
    `main_weight` when their dtypes match.

    ```mlir
    #fsdp.buffer<main_weight : f32>
    #fsdp.buffer<model_weight : f32, aliases main_weight>
    ```
  }];
  let parameters = (ins "::fsdp::BufferRole":$role, "::mlir::Type":$dtype,
                        "bool":$aliasesMainWeight);
  let hasCustomAssemblyFormat = 1;
}

#endif // FSDP_DIALECT_FSDP_IR_FSDPATTRS_TD
