// RUN: fsdp-opt %s --split-input-file --verify-diagnostics

// Each rule of an experts unit (docs/Experts.md), one case each.

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  // expected-error @+1 {{expert axis 'tp' is not one of its axes}}
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "tp"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  // expected-error @+1 {{is not a view of mesh @mesh: the expert mesh's axes multiply out to 6 ranks but the world mesh has 8}}
  fsdp.expert_mesh @experts ["edp" = 3, "ep" = 2] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  // expected-error @+1 {{needs an axis besides the expert axis}}
  fsdp.expert_mesh @experts ["ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{experts name @nothing, which is no 'fsdp.expert_mesh' of the model}}
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@nothing, count = 8, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{has experts but is not a fully_shard unit}}
    fsdp.module "experts" experts <@experts, count = 8, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{fully_shard has 2 placements but expert mesh @experts has 1 axes besides its expert axis}}
    fsdp.module "experts" fully_shard <[replicate, shard], main_params = f32> experts <@experts, count = 8, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{has 6 experts, which do not divide among the 4 expert-parallel ranks of @experts (the count must be a positive multiple of 4)}}
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 6, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
      // expected-error @+1 {{'experts.bias' has no local expert number: grouped experts are named <stem><i>}}
      fsdp.param "bias" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
      // expected-error @+1 {{'experts.weight2' is local expert 2 but each rank holds experts 0 to 1 (8 over 4 expert-parallel ranks)}}
      fsdp.param "weight2" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{lacks local expert 1 of weight: each rank holds experts 0 to 1, each exactly once}}
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
      // expected-error @+1 {{'experts.weight1' has type 'tensor<5xf32>' but the other experts' weight have 'tensor<4xf32>': every expert must be alike}}
      fsdp.param "weight1" : tensor<5xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, grouped> {
      fsdp.param "weight0" : tensor<4xf32>
      // expected-error @+1 {{'experts.weight01' has no local expert number}}
      fsdp.param "weight01" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "embed" : tensor<4xf32>
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 4, grouped> {
      // expected-error @+1 {{'experts.weight0' is an expert parameter and cannot be tied}}
      fsdp.param "weight0" : tensor<4xf32> tied_to "embed"
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{names its experts local_experts but has no child module 'local_experts'}}
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, local_experts> {
      fsdp.param "weight0" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, local_experts> {
      fsdp.module "local_experts" {
        fsdp.module "0" { fsdp.param "weight" : tensor<4xf32> }
        fsdp.module "x" {
          // expected-error @+1 {{'experts.local_experts.x.weight' is not under local_experts.<i> of experts unit "experts"}}
          fsdp.param "weight" : tensor<4xf32>
        }
      }
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error @+1 {{lacks local expert 1 of local_experts.<i>.fc.weight}}
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 8, local_experts> {
      fsdp.module "local_experts" {
        fsdp.module "0" { fsdp.module "fc" { fsdp.param "weight" : tensor<4xf32> } }
      }
    }
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 8]
  fsdp.expert_mesh @experts ["edp" = 2, "ep" = 4] experts "ep"
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "experts" fully_shard <[shard], main_params = f32> experts <@experts, count = 4, grouped> {
      // expected-error @+1 {{is a fully_shard unit inside experts unit "experts"}}
      fsdp.module "inner" fully_shard <[shard], main_params = f32> {
        fsdp.param "weight0" : tensor<4xf32>
      }
    }
  }
}
