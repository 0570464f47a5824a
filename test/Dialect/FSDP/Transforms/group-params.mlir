// RUN: fsdp-opt %s --split-input-file --fsdp-group-params --verify-diagnostics | FileCheck %s

// One unit per group key (dtype, requires_grad), groups in first-occurrence
// order, members in named_parameters() order: a module's own parameters,
// then its children's, skipping nested units (which form their own groups).
// CHECK-LABEL: fsdp.model @mixed
// CHECK:      fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> {
// CHECK-NEXT:   fsdp.member ["w"] : tensor<5x3xbf16>
// CHECK-NEXT:   fsdp.member ["sub.a"] : tensor<7xbf16>
// CHECK-NEXT: }
// CHECK-NEXT: fsdp.param_group @group1 unit "" : f32 policy <[shard], main_params = f32> {
// CHECK-NEXT:   fsdp.member ["norm"] : tensor<4xf32>
// CHECK-NEXT: }
// CHECK-NEXT: fsdp.param_group @group2 unit "" : bf16 frozen policy <[shard], main_params = f32> {
// CHECK-NEXT:   fsdp.member ["sub.frozen"] : tensor<2x2xbf16>
// CHECK-NEXT: }
// CHECK-NEXT: fsdp.param_group @group3 unit "layers.0" : bf16 policy <[shard], main_params = f32, main_grads = f32> {
// CHECK-NEXT:   fsdp.member ["layers.0.q"] : tensor<4x4xbf16>
// CHECK-NEXT:   fsdp.member ["layers.0.mlp.up"] : tensor<8x4xbf16>
// CHECK-NEXT: }
fsdp.model @mixed {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "sub" {
      fsdp.param "a" : tensor<7xbf16>
      fsdp.param "frozen" : tensor<2x2xbf16> frozen
    }
    fsdp.module "layers" {
      fsdp.module "0" fully_shard <[shard], main_params = f32, main_grads = f32> {
        fsdp.module "mlp" {
          fsdp.param "up" : tensor<8x4xbf16>
        }
        fsdp.param "q" : tensor<4x4xbf16>
      }
    }
    fsdp.param "w" : tensor<5x3xbf16>
    fsdp.param "norm" : tensor<4xf32>
  }
}

// -----

// A tied parameter is one member under its first FQN in DFS order, with
// every FQN that names it (the root's own "norm" comes first, as in
// named_parameters()).
// CHECK-LABEL: fsdp.model @tied
// CHECK:      fsdp.param_group @group0 unit "" : bf16 policy <[replicate, shard], main_params = f32> {
// CHECK-NEXT:   fsdp.member ["norm"] : tensor<8xbf16>
// CHECK-NEXT:   fsdp.member ["head.weight", "embed.weight"] : tensor<16x8xbf16>
// CHECK-NEXT: }
fsdp.model @tied {
  fsdp.mesh @mesh ["dp_outer" = 2, "dp_shard" = 2]
  fsdp.module "" fully_shard <[replicate, shard], main_params = f32> {
    fsdp.module "head" {
      fsdp.param "weight" : tensor<16x8xbf16> tied_to "embed.weight"
    }
    fsdp.module "embed" {
      fsdp.param "weight" : tensor<16x8xbf16>
    }
    fsdp.param "norm" : tensor<8xbf16>
  }
}

// -----

// Frozen parameters outside every unit stay out of the groups.
// CHECK-LABEL: fsdp.model @outside
// CHECK:      fsdp.param_group @group0 unit "block" : f32 policy <[shard], main_params = f32> {
// CHECK-NEXT:   fsdp.member ["block.w"] : tensor<3xf32>
// CHECK-NEXT: }
// CHECK-NOT:  fsdp.param_group
fsdp.model @outside {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    fsdp.param "rope_cache" : tensor<16xf32> frozen
    fsdp.module "block" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<3xf32>
    }
  }
}

// -----

// expected-error@+1 {{model already has parameter groups; fsdp-group-params runs once}}
fsdp.model @twice {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<3xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["w"] : tensor<3xf32>
  }
}
