// RUN: fsdp-opt %s --fsdp-lower-fully-shard | FileCheck %s
// RUN: fsdp-opt %s --fsdp-lower-fully-shard | fsdp-translate --emit-layout-json | FileCheck %s --check-prefix=LAYOUT
// RUN: fsdp-opt %s --fsdp-lower-fully-shard | fsdp-translate --emit-checkpoint-plan --plan-format=json | grep -o '"key": "model.moe[^"]*"' | FileCheck %s --check-prefix=PLAN

// A mixture-of-experts layer on world dp=8 viewed as (edp=2, ep=4): 8
// experts, 2 per rank, named weight0/weight1 (grouped). The dense unit
// packs for 8 ranks; the experts pack for their 2-rank data-parallel mesh,
// and world rank r takes the range of its edp coordinate r / 4.
// CHECK:      fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 4 size 32 shard_size 4 ranks [0, 4, 8, 12, 16, 20, 24, 28]
// CHECK:      fsdp.param_group @group1 unit "moe.experts" : f32 policy <[shard], main_params = f32> chunk 3 size 30 shard_size 15 ranks [0, 0, 0, 0, 15, 15, 15, 15]
// CHECK-NEXT:   fsdp.member ["moe.experts.weight0"] : tensor<5x3xf32> offset 0 pieces [0: [0, 5) at 0]
// CHECK-NEXT:   fsdp.member ["moe.experts.weight1"] : tensor<5x3xf32> offset 15 pieces [1: [0, 5) at 0]

// The layout JSON names each local expert's tensor on every EP coordinate.
// LAYOUT:      "unit": "moe.experts",
// LAYOUT-NEXT: "experts": {
// LAYOUT-NEXT:   "mesh": "experts",
// LAYOUT-NEXT:   "count": 8,
// LAYOUT-NEXT:   "per_rank": 2,
// LAYOUT-NEXT:   "naming": "grouped",
// LAYOUT-NEXT:   "expert_coords": [
// LAYOUT-NEXT:    0,
// LAYOUT-NEXT:    1,
// LAYOUT:      "fqn": "moe.experts.weight1",
// LAYOUT:      "expert": {
// LAYOUT-NEXT:  "head": "moe.experts.weight",
// LAYOUT-NEXT:  "local": 1,
// LAYOUT-NEXT:  "tail": ""
// LAYOUT:      "global_fqns": [
// LAYOUT-NEXT:  "moe.experts.weight1",
// LAYOUT-NEXT:  "moe.experts.weight3",
// LAYOUT-NEXT:  "moe.experts.weight5",
// LAYOUT-NEXT:  "moe.experts.weight7"

// The plan writes each expert under its global number, rank by rank (ep is
// r % 4, edp is r / 4): local expert i of ep e is global i + 2e, and edp 0
// holds local expert 0, edp 1 local expert 1. Each key is written once
// (rank order of the writes), then read back on the same ranks.
// PLAN: "key": "model.moe.experts.weight0"
// PLAN: "key": "model.moe.experts.weight0"
// PLAN: "key": "model.moe.experts.weight2"
// PLAN: "key": "model.moe.experts.weight2"
// PLAN: "key": "model.moe.experts.weight4"
// PLAN: "key": "model.moe.experts.weight4"
// PLAN: "key": "model.moe.experts.weight6"
// PLAN: "key": "model.moe.experts.weight6"
// PLAN: "key": "model.moe.experts.weight1"
// PLAN: "key": "model.moe.experts.weight1"
// PLAN: "key": "model.moe.experts.weight3"
// PLAN: "key": "model.moe.experts.weight3"
// PLAN: "key": "model.moe.experts.weight5"
// PLAN: "key": "model.moe.experts.weight5"
// PLAN: "key": "model.moe.experts.weight7"
// PLAN-NEXT: "key": "model.moe.experts.weight7"
// PLAN-NOT: "key"
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
