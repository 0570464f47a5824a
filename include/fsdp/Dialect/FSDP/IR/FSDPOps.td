//===- FSDPOps.td - fsdp dialect operations ----------------*- tablegen -*-===//
#ifndef FSDP_DIALECT_FSDP_IR_FSDPOPS_TD
#define FSDP_DIALECT_FSDP_IR_FSDPOPS_TD

include "fsdp/Dialect/FSDP/IR/FSDPBase.td"
include "fsdp/Dialect/FSDP/IR/FSDPAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/IR/CommonAttrConstraints.td"

class FSDP_Op<string mnemonic, list<Trait> traits = []>
    : Op<FSDP_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Model description
//===----------------------------------------------------------------------===//

def FSDP_ModelOp : FSDP_Op<"model", [
    Symbol, SymbolTable, IsolatedFromAbove, SingleBlock, NoTerminator]> {
  let summary = "a model: its mesh, optimizer and module tree";
  let description = [{
    The root of a model description. Its body holds exactly one `fsdp.mesh`,
    at most one `fsdp.optimizer` and exactly one root `fsdp.module` (named
    `""`), plus, after lowering, the parameter groups.

    The model verifier checks what needs the whole tree: sibling names are
    unique, every `fully_shard` unit has one placement per mesh axis, ties
    name an existing parameter of the same shape and element type, and every
    trainable parameter is owned by a `fully_shard` unit.

    ```mlir
    fsdp.model @model {
      fsdp.mesh @mesh ["dp" = 4]
      fsdp.optimizer adamw lr = 1.0e-03, betas = [0.9, 0.999], eps = 1.0e-08,
                     weight_decay = 1.0e-02, state = f32
      fsdp.module "" fully_shard <[shard], main_params = f32> {
        fsdp.param "weight" : tensor<5x3xbf16>
      }
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The model's mesh, or null when the body has none.
    MeshOp getMesh();
    /// The optimizer, or null when the model has none.
    OptimizerOp getOptimizer();
    /// The root module, or null when the body has none.
    NNModuleOp getRootModule();
  }];
}

def FSDP_MeshOp : FSDP_Op<"mesh", [Symbol, HasParent<"ModelOp">]> {
  let summary = "a device mesh: named axes with sizes";
  let description = [{
    The data-parallel device mesh. Flat rank = row-major index over the
    mesh coordinates (axis 0 slowest), as in `torch.distributed.DeviceMesh`.

    ```mlir
    fsdp.mesh @mesh ["dp_outer" = 2, "dp_shard" = 4]
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axis_names,
                       DenseI64ArrayAttr:$shape);
  let assemblyFormat = "$sym_name custom<MeshAxes>($axis_names, $shape) attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Number of ranks: the product of the axis sizes.
    int64_t getNumRanks();
  }];
}

def FSDP_ExpertMeshOp : FSDP_Op<"expert_mesh", [Symbol, HasParent<"ModelOp">]> {
  let summary = "the world's ranks viewed as an expert-parallel mesh";
  let description = [{
    The ranks of the model's `fsdp.mesh`, viewed row-major (axis 0 slowest)
    as these axes, whose sizes multiply out to the world size. The axis
    named by `experts` is expert parallelism: its coordinate selects which
    experts a rank holds. The other axes, in order, are the data-parallel
    mesh of the units that name this mesh in their `experts` attribute
    (docs/Experts.md). World `dp = 8` as `edp = 2, ep = 4`: rank r has
    edp = r / 4 and ep = r % 4, Megatron-Core's order of expert groups.

    ```mlir
    fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axis_names,
                       DenseI64ArrayAttr:$shape, StrAttr:$expert_axis);
  let assemblyFormat = [{
    $sym_name custom<MeshAxes>($axis_names, $shape) `experts` $expert_axis attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The view in the layout library's terms (the expert axis by index).
    ::fsdp::layout::ExpertMesh getLayoutMesh();
  }];
}

def FSDP_OptimizerOp : FSDP_Op<"optimizer", [HasParent<"ModelOp">]> {
  let summary = "the optimizer: kind, hyper-parameters and state dtype";
  let description = [{
    A per-parameter elementwise torch optimizer: Adam, AdamW or SGD. Its
    hyper-parameters are those of PyTorch's optimizer state dict: `betas`
    and `eps` for Adam/AdamW (with `amsgrad`), `momentum`, `dampening` and
    `nesterov` for SGD. They decide the state tensors every trainable
    parameter carries (of `state` dtype, sharded like the main weights), in
    torch's names (`getStateTensors`): `exp_avg`, `exp_avg_sq` and, with
    amsgrad, `max_exp_avg_sq` for Adam/AdamW; `momentum_buffer` for SGD with
    momentum. Adam/AdamW also keep a scalar `step` (`hasStepState`).

    ```mlir
    fsdp.optimizer adamw lr = 1.0e-03, betas = [0.9, 0.999], eps = 1.0e-08,
        amsgrad, weight_decay = 1.0e-02, state = f32
    fsdp.optimizer sgd lr = 1.0e-01, momentum = 9.0e-01, dampening = 0.0,
        weight_decay = 0.0, state = f32
    ```
  }];
  let arguments = (ins FSDP_OptimizerKindAttr:$kind, F64Attr:$lr,
                       OptionalAttr<DenseF64ArrayAttr>:$betas,
                       OptionalAttr<F64Attr>:$eps, UnitAttr:$amsgrad,
                       OptionalAttr<F64Attr>:$momentum,
                       OptionalAttr<F64Attr>:$dampening, UnitAttr:$nesterov,
                       F64Attr:$weight_decay, TypeAttr:$state);
  let assemblyFormat = [{
    $kind `lr` `=` $lr `,` (`betas` `=` $betas^ `,`)? (`eps` `=` $eps^ `,`)?
    (`amsgrad` $amsgrad^ `,`)? (`momentum` `=` $momentum^ `,`)?
    (`dampening` `=` $dampening^ `,`)? (`nesterov` $nesterov^ `,`)?
    `weight_decay` `=` $weight_decay `,` `state` `=` $state attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The per-parameter state tensors, as buffer roles, in torch's order.
    ::llvm::SmallVector<BufferRole> getStateTensors();
    /// Whether the optimizer keeps a scalar `step` per parameter.
    bool hasStepState();
  }];
}

def FSDP_NNModuleOp : FSDP_Op<"module", [
    ParentOneOf<["ModelOp", "NNModuleOp"]>, SingleBlock, NoTerminator]> {
  let summary = "a module of the model tree, optionally a fully_shard unit";
  let description = [{
    A node of the module tree (`torch.nn.Module`). FQNs join the module
    names and the parameter name with `.`; the root module's name is `""`.
    A module with a `fully_shard` attribute is a unit: it owns every
    parameter below it that no nested unit owns.

    ```mlir
    fsdp.module "layers" {
      fsdp.module "0" fully_shard <[shard], main_params = f32> {
        fsdp.param "bias" : tensor<7xbf16>
      }
    }
    ```
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<FSDP_FullyShardAttr>:$fully_shard,
                       OptionalAttr<FSDP_ExpertsAttr>:$experts);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $name (`fully_shard` $fully_shard^)? (`experts` $experts^)? attr-dict-with-keyword $body
  }];
  let hasVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [
    OpBuilder<(ins "::llvm::StringRef":$name, "FullyShardAttr":$fullyShard)>
  ];
  let extraClassDeclaration = [{
    /// Dot-joined path from the root module ("" for the root itself).
    std::string getFQN();
    /// The closest enclosing-or-self fully_shard unit, or null.
    NNModuleOp getOwningUnit();
    /// The expert mesh its `experts` attribute names, or null.
    ExpertMeshOp getExpertMesh();
  }];
}

def FSDP_ParamOp : FSDP_Op<"param", [HasParent<"NNModuleOp">]> {
  let summary = "a parameter: name, shape, element type, trainability, tie";
  let description = [{
    A parameter of its enclosing module. `frozen` marks a parameter that does
    not require gradients. `tied_to` names (by FQN) the parameter whose
    storage this one shares, which must have the same shape and element type.

    Supported element types: `f64 f32 bf16 f16 i64 i32 i16 i8 ui8 i1`.

    ```mlir
    fsdp.param "weight" : tensor<128256x4096xbf16>
    fsdp.param "lm_head" : tensor<128256x4096xbf16> tied_to "embed.weight"
    fsdp.param "mask" : tensor<16xi1> frozen
    ```
  }];
  let arguments = (ins StrAttr:$name, TypeAttrOf<AnyRankedTensor>:$type,
                       UnitAttr:$frozen, OptionalAttr<StrAttr>:$tied_to);
  let assemblyFormat = [{
    $name `:` $type (`frozen` $frozen^)? (`tied_to` $tied_to^)? attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
    bool getRequiresGrad() { return !getFrozen(); }
    /// Dot-joined module path and parameter name.
    std::string getFQN();
  }];
}

//===----------------------------------------------------------------------===//
// Lowered form: parameter groups and packed layouts
//===----------------------------------------------------------------------===//

def FSDP_ParamGroupOp : FSDP_Op<"param_group", [
    Symbol, HasParent<"ModelOp">, SingleBlock, NoTerminator]> {
  let summary = "a Megatron-FSDP parameter group: one packed flat buffer";
  let description = [{
    The parameters of one `fully_shard` unit (`unit`, an FQN) that share an
    element type and trainability, in first-occurrence DFS order, packed into
    one flat buffer. The lowering fills the layout in stages:

    - `fsdp-group-params` creates the group and its `fsdp.member`s;
    - `fsdp-pack-param-groups` sets `chunk` (LCM of the row sizes), `size`
      (padded to `chunk` times the mesh size) and each member's `offset`;
    - `fsdp-assign-rank-ranges` sets `shard_size`, `ranks` (the begin of each
      flat rank's main-weight range `[begin, begin + shard_size)`), the
      `buffers` and each member's `pieces`.

    The metadata is O(members + ranks): pieces are listed only where they
    are non-empty. The verifier checks every stage that is present: the
    packing equals Megatron-FSDP v2's, every tensor is tiled exactly by its
    pieces in whole rows inside its rank's range, and rank ranges follow the
    mesh and placements.

    ```mlir
    fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32>
        chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36]
        buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>] {
      fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrAttr:$unit,
                       TypeAttr:$dtype, UnitAttr:$frozen,
                       FSDP_FullyShardAttr:$policy,
                       OptionalAttr<I64Attr>:$chunk,
                       OptionalAttr<I64Attr>:$size,
                       OptionalAttr<I64Attr>:$shard_size,
                       OptionalAttr<DenseI64ArrayAttr>:$ranks,
                       OptionalAttr<TypedArrayAttrBase<FSDP_BufferAttr, "buffers">>:$buffers);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $sym_name `unit` $unit `:` $dtype (`frozen` $frozen^)? `policy` $policy
    (`chunk` $chunk^)? (`size` $size^)? (`shard_size` $shard_size^)?
    (`ranks` $ranks^)? (`buffers` $buffers^)? attr-dict-with-keyword $body
  }];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    bool getRequiresGrad() { return !getFrozen(); }
    /// The buffer of `role`, or null when the group has none.
    BufferAttr getBuffer(BufferRole role);
  }];
}

def FSDP_MemberOp : FSDP_Op<"member", [HasParent<"ParamGroupOp">]> {
  let summary = "a tensor of a parameter group: FQNs, offset and pieces";
  let description = [{
    One physical tensor of a group. `fqns` lists every FQN that names it
    (a tied parameter has several; the first in DFS order leads). `offset`
    is its element offset in the group's flat buffer. `pieces` lists, for
    each shard index (buffer order) that holds part of it, the rows
    `[begin, end)` of the global tensor and the element offset of that part
    inside the shard: `shard: [begin, end) at local_offset`.

    ```mlir
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
    ```
  }];
  let arguments = (ins StrArrayAttr:$fqns, TypeAttrOf<AnyRankedTensor>:$type,
                       OptionalAttr<I64Attr>:$offset,
                       OptionalAttr<DenseI64ArrayAttr>:$pieces);
  let assemblyFormat = [{
    $fqns `:` $type (`offset` $offset^)? (`pieces` custom<Pieces>($pieces)^)? attr-dict
  }];
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
    /// The leading FQN.
    ::llvm::StringRef getFQN() {
      return ::llvm::cast<::mlir::StringAttr>(getFqns()[0]).getValue();
    }
    /// Pieces are stored flat, four numbers each.
    struct Piece { int64_t shard, rowBegin, rowEnd, localOffset; };
    ::llvm::SmallVector<Piece> getPieceList();
  }];
  let hasVerifier = 1;
}

#endif // FSDP_DIALECT_FSDP_IR_FSDPOPS_TD
