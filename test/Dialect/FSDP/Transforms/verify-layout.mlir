// RUN: fsdp-opt %s --split-input-file --fsdp-verify-layout=report-canonical-mismatch --verify-diagnostics | FileCheck %s
// Without the flag the pass is silent on a valid layout.
// RUN: fsdp-translate --import-model-json %examples/worked-example.json | fsdp-opt --fsdp-lower-fully-shard 2>&1 >/dev/null | FileCheck %s --allow-empty --check-prefix=SILENT
// RUN: fsdp-translate --import-model-json %examples/worked-example.json | fsdp-opt --fsdp-lower-fully-shard=report-canonical-mismatch 2>&1 >/dev/null | FileCheck %s --check-prefix=LOUD
// SILENT-NOT: remark
// LOUD: remark: 'p0' rows per rank are 4/1/0/0
// RUN: fsdp-translate --import-model-json %S/../../../Import/ModelJSON/Inputs/torch-fsdp2-ws2.json | fsdp-opt --fsdp-lower-fully-shard=report-canonical-mismatch 2>&1 >/dev/null | FileCheck %s --check-prefix=FC1

// The worked example (docs/MegatronFSDPLayout.md): every parameter's true
// pieces differ from canonical Shard(0): P0 rows 4/1/0/0 vs 2/2/1/0, P1
// 0/0/0/7 vs 2/2/2/1, P2 0/1/3/0 vs 1/1/1/1. The IR is unchanged.
// CHECK-LABEL: fsdp.model @worked
// CHECK: fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
fsdp.model @worked {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    // expected-remark@+1 {{'p0' rows per rank are 4/1/0/0 but canonical Shard(0) assumes 2/2/1/0: a checkpointer that ignores the packed layout corrupts it silently}}
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    // expected-remark@+1 {{'p1' rows per rank are 0/0/0/7 but canonical Shard(0) assumes 2/2/2/1}}
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    // expected-remark@+1 {{'p2' rows per rank are 0/1/3/0 but canonical Shard(0) assumes 1/1/1/1}}
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// A layout that happens to match canonical Shard(0) gets no remark.
// CHECK-LABEL: fsdp.model @even
fsdp.model @even {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4x2xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 2 size 8 shard_size 4 ranks [0, 4] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : f32, aliases main_weight>, #fsdp.buffer<main_grad : f32>] {
    fsdp.member ["w"] : tensor<4x2xf32> offset 0 pieces [0: [0, 2) at 0, 1: [2, 4) at 0]
  }
}

// -----

// expected-error@+1 {{has fully_shard units but no parameter groups; run fsdp-group-params}}
fsdp.model @ungrouped {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
}

// -----

fsdp.model @unpacked {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{is not fully lowered: missing chunk/size (run fsdp-pack-param-groups)}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["w"] : tensor<4xf32>
  }
}

// -----

fsdp.model @unassigned {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{is not fully lowered: missing rank ranges and buffers (run fsdp-assign-rank-ranges)}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 1 size 4 {
    fsdp.member ["w"] : tensor<4xf32> offset 0
  }
}

// The real FSDP2 fixture's fc1 (test vector "the uneven fc1"): the 16-row
// weight is 9/7 in the packed buffer where Shard(0) assumes 8/8.
// FC1: remark: 'fc1.weight' rows per rank are 9/7 but canonical Shard(0) assumes 8/8
