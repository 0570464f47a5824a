// RUN: fsdp-opt %s --split-input-file --verify-diagnostics

// Counts past the compiler's limits (docs/ModelDescription.md, "Limits"),
// refused before anything is sized by them; and the counts at the limits.

fsdp.model @experts_2e40 {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 2] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{has 1099511627776 experts, more than 1048576 (2^20, the compiler's limit)}}
    fsdp.module "experts" fully_shard <[shard], main_params = f32>
        experts <@experts, count = 1099511627776, grouped> {
      fsdp.param "weight0" : tensor<3x2xf32>
    }
  }
}

// -----

fsdp.model @experts_2e63 {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 2] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{has 9223372036854775806 experts, more than 1048576 (2^20, the compiler's limit)}}
    fsdp.module "experts" fully_shard <[shard], main_params = f32>
        experts <@experts, count = 9223372036854775806, local_experts> {
      fsdp.module "local_experts" {
        fsdp.module "0" {
          fsdp.param "w" : tensor<3x2xf32>
        }
      }
    }
  }
}

// -----

// 2^20 experts, 2 per rank: at the limit.
fsdp.model @experts_max {
  fsdp.mesh @mesh ["dp" = 1048576]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 524288] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "experts" fully_shard <[shard], main_params = f32>
        experts <@experts, count = 1048576, grouped> {
      fsdp.param "weight0" : tensor<3x2xf32>
      fsdp.param "weight1" : tensor<3x2xf32>
    }
  }
}

// -----

// 2^19 experts a rank, one given: the check's memory follows the parameters.
fsdp.model @lacks {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 2] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{lacks local expert 0 of local_experts.<i>.w: each rank holds experts 0 to 524287, each exactly once}}
    fsdp.module "experts" fully_shard <[shard], main_params = f32>
        experts <@experts, count = 1048576, local_experts> {
      fsdp.module "local_experts" {
        fsdp.module "524287" {
          fsdp.param "w" : tensor<3x2xf32>
        }
      }
    }
  }
}

// -----

// 2^20 experts of 8 parameters, then 2^20 of 9: 17 x 2^20 global expert
// tensors (checkpoint keys) in all.
fsdp.model @expert_tensors {
  fsdp.mesh @mesh ["dp" = 2097152]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 1048576] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "a" fully_shard <[shard], main_params = f32>
        experts <@experts, count = 1048576, grouped> {
      fsdp.param "a0" : tensor<3x2xf32>
      fsdp.param "b0" : tensor<3x2xf32>
      fsdp.param "c0" : tensor<3x2xf32>
      fsdp.param "d0" : tensor<3x2xf32>
      fsdp.param "e0" : tensor<3x2xf32>
      fsdp.param "f0" : tensor<3x2xf32>
      fsdp.param "g0" : tensor<3x2xf32>
      fsdp.param "h0" : tensor<3x2xf32>
    }
    // expected-error @+1 {{brings the model's global expert tensors (experts x parameters of one expert, over all experts units) past 16777216 (2^24, the compiler's limit) with its 1048576 experts x 9 parameters}}
    fsdp.module "b" fully_shard <[shard], main_params = f32>
        experts <@experts, count = 1048576, grouped> {
      fsdp.param "a0" : tensor<3x2xf32>
      fsdp.param "b0" : tensor<3x2xf32>
      fsdp.param "c0" : tensor<3x2xf32>
      fsdp.param "d0" : tensor<3x2xf32>
      fsdp.param "e0" : tensor<3x2xf32>
      fsdp.param "f0" : tensor<3x2xf32>
      fsdp.param "g0" : tensor<3x2xf32>
      fsdp.param "h0" : tensor<3x2xf32>
      fsdp.param "i0" : tensor<3x2xf32>
    }
  }
}

// -----

// 2^24 of them: at the limit.
fsdp.model @expert_tensors_max {
  fsdp.mesh @mesh ["dp" = 2097152]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 1048576] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "a" fully_shard <[shard], main_params = f32>
        experts <@experts, count = 1048576, grouped> {
      fsdp.param "a0" : tensor<3x2xf32>
      fsdp.param "b0" : tensor<3x2xf32>
      fsdp.param "c0" : tensor<3x2xf32>
      fsdp.param "d0" : tensor<3x2xf32>
      fsdp.param "e0" : tensor<3x2xf32>
      fsdp.param "f0" : tensor<3x2xf32>
      fsdp.param "g0" : tensor<3x2xf32>
      fsdp.param "h0" : tensor<3x2xf32>
    }
    fsdp.module "b" fully_shard <[shard], main_params = f32>
        experts <@experts, count = 1048576, grouped> {
      fsdp.param "a0" : tensor<3x2xf32>
      fsdp.param "b0" : tensor<3x2xf32>
      fsdp.param "c0" : tensor<3x2xf32>
      fsdp.param "d0" : tensor<3x2xf32>
      fsdp.param "e0" : tensor<3x2xf32>
      fsdp.param "f0" : tensor<3x2xf32>
      fsdp.param "g0" : tensor<3x2xf32>
      fsdp.param "h0" : tensor<3x2xf32>
    }
  }
}

// -----

fsdp.model @param_elements {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{parameter 'w' has more than 1152921504606846976 elements (2^60, the compiler's limit)}}
    fsdp.param "w" : tensor<4611686018427387904x4xf32>
  }
}

// -----

fsdp.model @param_elements_overflow {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{parameter 'w' has more than 1152921504606846976 elements (2^60, the compiler's limit)}}
    fsdp.param "w" : tensor<1099511627776x1099511627776x1099511627776xf32>
  }
}

// -----

// 2^60 elements: at the limit.
fsdp.model @param_elements_max {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<1073741824x1073741824xf32>
  }
}

// -----

// 2^24 ranks: at the limit (past it: invalid.mlir, @too_many_ranks).
fsdp.model @ranks_max {
  fsdp.mesh @mesh ["a" = 4096, "b" = 4096]
  fsdp.module "" fully_shard <[shard, shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
}
