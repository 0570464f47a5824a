// RUN: fsdp-opt %s --fsdp-lower-fully-shard | FileCheck %s
// RUN: fsdp-opt %s --fsdp-lower-fully-shard | not fsdp-translate --emit-checkpoint-plan -o /dev/null 2>&1 | FileCheck %s --check-prefix=PLAN

// A mixture-of-experts layer on world dp=8 viewed as (edp=2, ep=4): 8
// experts, 2 per rank, named weight0/weight1 (grouped). The dense unit
// packs for 8 ranks; the experts pack for their 2-rank data-parallel mesh,
// and world rank r takes the range of its edp coordinate r / 4.
// CHECK:      fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 4 size 32 shard_size 4 ranks [0, 4, 8, 12, 16, 20, 24, 28]
// CHECK:      fsdp.param_group @group1 unit "moe.experts" : f32 policy <[shard], main_params = f32> chunk 3 size 30 shard_size 15 ranks [0, 0, 0, 0, 15, 15, 15, 15]
// CHECK-NEXT:   fsdp.member ["moe.experts.weight0"] : tensor<5x3xf32> offset 0 pieces [0: [0, 5) at 0]
// CHECK-NEXT:   fsdp.member ["moe.experts.weight1"] : tensor<5x3xf32> offset 15 pieces [1: [0, 5) at 0]

// Plans refuse experts until they carry global expert keys.
// PLAN: error: unit "moe.experts" holds experts: checkpoint plans with global expert keys are not built yet
fsdp.model @moe {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "router" : tensor<4x4xf32>
    fsdp.module "moe" {
      fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, grouped> {
        fsdp.param "weight0" : tensor<5x3xf32>
        fsdp.param "weight1" : tensor<5x3xf32>
      }
    }
  }
}
