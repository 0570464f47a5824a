// RUN: fsdp-opt %s --split-input-file --fsdp-assign-rank-ranges --verify-diagnostics | FileCheck %s

// The worked example (docs/MegatronFSDPLayout.md) on 4 ranks: pieces per
// shard (rows [begin, end) at local offset), buffers from the policy (f32
// main weights, bf16 grads) and the optimizer (f32 moments).
// CHECK-LABEL: fsdp.model @worked
// CHECK:      fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32, main_grads = bf16> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36]
// CHECK-SAME:   buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>, #fsdp.buffer<exp_avg : f32>, #fsdp.buffer<exp_avg_sq : f32>] {
// CHECK-NEXT:   fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
// CHECK-NEXT:   fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
// CHECK-NEXT:   fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
fsdp.model @worked {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.optimizer adamw lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = 0.01, state = f32
  fsdp.module "" fully_shard <[shard], main_params = f32, main_grads = bf16> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32, main_grads = bf16> chunk 12 size 48 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
  }
}

// -----

// Worked example, HSDP (replicate, shard) on (2, 2): inner rank i owns
// [24 i, 24 i + 24) on both replicas.
// CHECK-LABEL: fsdp.model @hsdp
// CHECK:      chunk 12 size 48 shard_size 24 ranks [0, 24, 0, 24]
// CHECK-NEXT:   fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 5) at 0]
// CHECK-NEXT:   fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [1: [0, 7) at 12]
// CHECK-NEXT:   fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [0: [0, 1) at 20, 1: [1, 4) at 0]
fsdp.model @hsdp {
  fsdp.mesh @mesh ["dp_outer" = 2, "dp_shard" = 2]
  fsdp.module "" fully_shard <[replicate, shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[replicate, shard], main_params = f32> chunk 12 size 48 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
  }
}

// -----

// Worked example, HFSDP (shard, shard) on (2, 2): rank (o, i) = 2o + i owns
// [24 i + 12 o, +12): ranks 0..3 begin at 0, 24, 12, 36.
// CHECK-LABEL: fsdp.model @hfsdp
// CHECK:      chunk 12 size 48 shard_size 12 ranks [0, 24, 12, 36]
// CHECK-NEXT:   fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
fsdp.model @hfsdp {
  fsdp.mesh @mesh ["dp_outer" = 2, "dp_shard" = 2]
  fsdp.module "" fully_shard <[shard, shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard, shard], main_params = f32> chunk 12 size 48 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
  }
}

// -----

// f32 parameters: model weights alias the main weights. Frozen groups have
// no gradient and no optimizer state; integer parameters keep their dtype.
// CHECK-LABEL: fsdp.model @dtypes
// CHECK:      unit "" : f32 policy
// CHECK-SAME:   buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : f32, aliases main_weight>, #fsdp.buffer<main_grad : f32>, #fsdp.buffer<exp_avg : bf16>, #fsdp.buffer<exp_avg_sq : bf16>]
// CHECK:      unit "" : i64 frozen policy
// CHECK-SAME:   buffers [#fsdp.buffer<main_weight : i64>, #fsdp.buffer<model_weight : i64, aliases main_weight>] {
fsdp.model @dtypes {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = 0.0, state = bf16
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
    fsdp.param "ids" : tensor<4xi64> frozen
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 1 size 4 {
    fsdp.member ["w"] : tensor<4xf32> offset 0
  }
  fsdp.param_group @group1 unit "" : i64 frozen policy <[shard], main_params = f32> chunk 1 size 4 {
    fsdp.member ["ids"] : tensor<4xi64> offset 0
  }
}

// -----

fsdp.model @unpacked {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{is not packed; run fsdp-pack-param-groups first}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["w"] : tensor<4xf32>
  }
}
