// RUN: fsdp-opt %s --split-input-file --fsdp-pack-param-groups | FileCheck %s

// The worked example (docs/MegatronFSDPLayout.md): chunk lcm(3, 1, 4) = 12;
// P2 is P0's conjugate at 20; P1 goes to the tail at 36; size padded to
// 12 x 4 = 48.
// CHECK-LABEL: fsdp.model @worked
// CHECK:      fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 {
// CHECK-NEXT:   fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
// CHECK-NEXT:   fsdp.member ["p1"] : tensor<7xbf16> offset 36
// CHECK-NEXT:   fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
fsdp.model @worked {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> {
    fsdp.member ["p0"] : tensor<5x3xbf16>
    fsdp.member ["p1"] : tensor<7xbf16>
    fsdp.member ["p2"] : tensor<4x4xbf16>
  }
}

// -----

// Test vector "fills gaps" (docs/MegatronFSDPLayout.md): fragments fill
// holes at row-aligned offsets; 5 ranks.
// CHECK-LABEL: fsdp.model @fills_gaps
// CHECK:      chunk 12 size 60 {
// CHECK-NEXT:   fsdp.member ["a"] : tensor<2x6xf32> offset 0
// CHECK-NEXT:   fsdp.member ["b"] : tensor<4x4xf32> offset 12
// CHECK-NEXT:   fsdp.member ["c"] : tensor<4x4xf32> offset 32
// CHECK-NEXT:   fsdp.member ["d"] : tensor<1x2xf32> offset 28
// CHECK-NEXT:   fsdp.member ["e"] : tensor<1x6xf32> offset 48
fsdp.model @fills_gaps {
  fsdp.mesh @mesh ["dp" = 5]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "a" : tensor<2x6xf32>
    fsdp.param "b" : tensor<4x4xf32>
    fsdp.param "c" : tensor<4x4xf32>
    fsdp.param "d" : tensor<1x2xf32>
    fsdp.param "e" : tensor<1x6xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["a"] : tensor<2x6xf32>
    fsdp.member ["b"] : tensor<4x4xf32>
    fsdp.member ["c"] : tensor<4x4xf32>
    fsdp.member ["d"] : tensor<1x2xf32>
    fsdp.member ["e"] : tensor<1x6xf32>
  }
}

// -----

// Test vector "the uneven fc1" (docs/MegatronFSDPLayout.md): the 16-row
// weight is split 9/7 on two ranks (chunk 8, size 144); HSDP pads to the
// product of ALL mesh axes.
// CHECK-LABEL: fsdp.model @fc1_hsdp
// CHECK:      chunk 8 size 160 {
// CHECK-NEXT:   fsdp.member ["weight"] : tensor<16x8xf32> offset 0
// CHECK-NEXT:   fsdp.member ["bias"] : tensor<16xf32> offset 128
fsdp.model @fc1_hsdp {
  fsdp.mesh @mesh ["dp_outer" = 5, "dp_shard" = 2]
  fsdp.module "" fully_shard <[replicate, shard], main_params = f32> {
    fsdp.param "weight" : tensor<16x8xf32>
    fsdp.param "bias" : tensor<16xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[replicate, shard], main_params = f32> {
    fsdp.member ["weight"] : tensor<16x8xf32>
    fsdp.member ["bias"] : tensor<16xf32>
  }
}
