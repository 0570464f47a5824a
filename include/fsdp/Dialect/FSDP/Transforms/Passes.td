//===- Passes.td - fsdp lowering passes --------------------*- tablegen -*-===//
#ifndef FSDP_DIALECT_FSDP_TRANSFORMS_PASSES_TD
#define FSDP_DIALECT_FSDP_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def GroupParams : Pass<"fsdp-group-params", "::fsdp::ModelOp"> {
  let summary = "Group each fully_shard unit's parameters by dtype and trainability";
  let description = [{
    For every `fully_shard` unit, collects the parameters it owns (its own,
    then its children's, skipping nested units, as Megatron-FSDP's
    `_collect_owned_parameters` does) and splits them by (element type,
    requires_grad) into `fsdp.param_group`s, groups in first-occurrence
    order and members in DFS order. A tied parameter becomes one member
    carrying all its FQNs, listed where its first FQN occurs.
  }];
}

def PackParamGroups : Pass<"fsdp-pack-param-groups", "::fsdp::ModelOp"> {
  let summary = "Pack each parameter group into one flat buffer (Megatron-FSDP v2)";
  let description = [{
    Sets each group's `chunk` and padded `size` and each member's element
    `offset`, exactly as Megatron-FSDP v2's `GlobalLayout.build` does for the
    mesh size (the product of all mesh axes, replicated ones included).
  }];
}

def AssignRankRanges : Pass<"fsdp-assign-rank-ranges", "::fsdp::ModelOp"> {
  let summary = "Assign each rank's buffer range, each member's pieces and the buffers";
  let description = [{
    Sets each group's `shard_size`, every flat rank's range begin (`ranks`),
    the buffers with their dtypes from the mixed-precision policy and the
    optimizer (main_weight, model_weight, main_grad, then the optimizer's
    state tensors: exp_avg, exp_avg_sq[, max_exp_avg_sq] or momentum_buffer),
    and each member's non-empty pieces (shard, rows, local offset).
  }];
}

def VerifyLayout : Pass<"fsdp-verify-layout", "::fsdp::ModelOp"> {
  let summary = "Verify that every tensor is tiled exactly by its pieces";
  let description = [{
    Checks that the lowering is complete (every trainable parameter is in
    exactly one group, every group packed and assigned) and that every
    layout is valid: whole rows, inside the rank's range, tiled exactly,
    equal to Megatron-FSDP's packing. With `report-canonical-mismatch`, emits
    a remark for every parameter whose true pieces differ from canonical
    `torch.chunk` Shard(0) pieces: where a checkpointer that ignores the
    layout corrupts the checkpoint silently.
  }];
  let options = [
    Option<"reportCanonicalMismatch", "report-canonical-mismatch", "bool",
           /*default=*/"false",
           "Remark on every parameter whose pieces differ from canonical Shard(0)">
  ];
}

#endif // FSDP_DIALECT_FSDP_TRANSFORMS_PASSES_TD
