// RUN: fsdp-opt %s --fsdp-lower-fully-shard --verify-diagnostics

// Every parameter group lists a rank range per world rank: 2^24 ranks x 9
// groups would be 2^27 + 2^24 of them, past the limit of 2^27
// (docs/ModelDescription.md, "Limits"). The lowering refuses the model
// before it allocates them.

// expected-error @+1 {{the lowered model would list 16777216 ranks x 9 parameter groups = 150994944 rank ranges, more than 134217728 (2^27, the compiler's limit): use fewer ranks or fewer fully_shard units}}
fsdp.model @rank_ranges {
  fsdp.mesh @mesh ["dp" = 16777216]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
    fsdp.module "l0" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
    fsdp.module "l1" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
    fsdp.module "l2" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
    fsdp.module "l3" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
    fsdp.module "l4" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
    fsdp.module "l5" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
    fsdp.module "l6" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
    fsdp.module "l7" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
  }
}
