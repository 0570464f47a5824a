// RUN: fsdp-opt %s -split-input-file -verify-diagnostics

// expected-error@+1 {{expects exactly one 'fsdp.mesh', found 0}}
fsdp.model @no_mesh {
  fsdp.module "" {
  }
}

// -----

// expected-error@+1 {{expects exactly one 'fsdp.mesh', found 2}}
fsdp.model @two_meshes {
  fsdp.mesh @a ["dp" = 2]
  fsdp.mesh @b ["dp" = 2]
  fsdp.module "" {
  }
}

// -----

// expected-error@+1 {{expects exactly one root 'fsdp.module', found 0}}
fsdp.model @no_root {
  fsdp.mesh @mesh ["dp" = 2]
}

// -----

fsdp.model @two_optimizers {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = 0.0, state = f32
  // expected-error@+1 {{duplicate optimizer: a model has at most one}}
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @mesh_without_axes {
  // expected-error@+1 {{mesh must have at least one axis}}
  fsdp.mesh @mesh []
  fsdp.module "" {
  }
}

// -----

fsdp.model @duplicate_axis {
  // expected-error@+1 {{duplicate mesh axis name 'dp'}}
  fsdp.mesh @mesh ["dp" = 2, "dp" = 2]
  fsdp.module "" {
  }
}

// -----

fsdp.model @empty_axis_name {
  // expected-error@+1 {{mesh axis name must not be empty}}
  fsdp.mesh @mesh ["" = 2]
  fsdp.module "" {
  }
}

// -----

fsdp.model @zero_axis {
  // expected-error@+1 {{mesh axis 'dp' must have a positive size, got 0}}
  fsdp.mesh @mesh ["dp" = 0]
  fsdp.module "" {
  }
}

// -----

fsdp.model @named_root {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{the root module must be named "", got "root"}}
  fsdp.module "root" {
  }
}

// -----

fsdp.model @empty_child_name {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    // expected-error@+1 {{module name must not be empty}}
    fsdp.module "" {
    }
  }
}

// -----

fsdp.model @dotted_name {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error@+1 {{parameter name 'a.b' must not contain '.'}}
    fsdp.param "a.b" : tensor<4xf32>
  }
}

// -----

fsdp.model @duplicate_param {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-note@+1 {{first defined here}}
    fsdp.param "w" : tensor<4xf32>
    // expected-error@+1 {{duplicate name 'w' in module ""}}
    fsdp.param "w" : tensor<4xf32>
  }
}

// -----

fsdp.model @duplicate_module {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "layers" {
      // expected-note@+1 {{first defined here}}
      fsdp.module "0" {
      }
      // expected-error@+1 {{duplicate name '0' in module "layers"}}
      fsdp.param "0" : tensor<4xf32>
    }
  }
}

// -----

fsdp.model @placement_count {
  fsdp.mesh @mesh ["dp_outer" = 2, "dp_shard" = 2]
  // expected-error@+1 {{fully_shard has 1 placements but mesh @mesh has 2 axes}}
  fsdp.module "" fully_shard <[shard], main_params = f32> {
  }
}

// -----

fsdp.model @not_a_suffix {
  fsdp.mesh @mesh ["dp_outer" = 2, "dp_shard" = 2]
  // expected-error@+1 {{fully_shard placements must have their 'shard' axes as a suffix}}
  fsdp.module "" fully_shard <[shard, replicate], main_params = f32> {
  }
}

// -----

fsdp.model @unknown_placement {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{unknown placement 'partial', expected 'shard' or 'replicate'}}
  fsdp.module "" fully_shard <[partial], main_params = f32> {
  }
}

// -----

fsdp.model @no_placements {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{fully_shard needs one placement per mesh axis, got none}}
  fsdp.module "" fully_shard <[], main_params = f32> {
  }
}

// -----

fsdp.model @integer_main_params {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{fully_shard main_params must be one of f64, f32, bf16, f16, got 'i32'}}
  fsdp.module "" fully_shard <[shard], main_params = i32> {
  }
}

// -----

fsdp.model @fp8_main_grads {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{fully_shard main_grads must be one of f64, f32, bf16, f16, got 'f8E4M3FN'}}
  fsdp.module "" fully_shard <[shard], main_params = f32, main_grads = f8E4M3FN> {
  }
}

// -----

fsdp.model @zero_rank {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error@+1 {{parameter 's' must have at least one dimension}}
    fsdp.param "s" : tensor<f32>
  }
}

// -----

fsdp.model @zero_dim {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error@+1 {{parameter 'w' dimension 1 must be a positive static size, got 0}}
    fsdp.param "w" : tensor<4x0xf32>
  }
}

// -----

fsdp.model @dynamic_dim {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error@+1 {{parameter 'w' dimension 0 must be a positive static size, got ?}}
    fsdp.param "w" : tensor<?x4xf32>
  }
}

// -----

fsdp.model @complex_type {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error@+1 {{parameter 'w' has unsupported element type 'complex<f32>'}}
    fsdp.param "w" : tensor<4xcomplex<f32>>
  }
}

// -----

fsdp.model @signed_integer_type {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    // expected-error@+1 {{parameter 'w' has unsupported element type 'si32'}}
    fsdp.param "w" : tensor<4xsi32> frozen
  }
}

// -----

fsdp.model @i4_type {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    // expected-error@+1 {{parameter 'w' has unsupported element type 'i4'}}
    fsdp.param "w" : tensor<4xi4> frozen
  }
}

// -----

fsdp.model @tie_to_unknown {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error@+1 {{is tied to unknown parameter 'embed.weight'}}
    fsdp.param "head" : tensor<4x4xf32> tied_to "embed.weight"
  }
}

// -----

fsdp.model @tie_to_self {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    // expected-error@+1 {{is tied to itself}}
    fsdp.param "head" : tensor<4x4xf32> tied_to "head"
  }
}

// -----

fsdp.model @tie_chain {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "a" : tensor<4x4xf32>
    fsdp.param "b" : tensor<4x4xf32> tied_to "a"
    // expected-error@+1 {{is tied to 'b', which is itself tied to 'a'}}
    fsdp.param "c" : tensor<4x4xf32> tied_to "b"
  }
}

// -----

fsdp.model @tie_other_shape {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "embed" : tensor<4x4xf32>
    // expected-error@+1 {{is tied to 'embed' of type 'tensor<4x4xf32>' but has type 'tensor<4x8xf32>'}}
    fsdp.param "head" : tensor<4x8xf32> tied_to "embed"
  }
}

// -----

fsdp.model @tie_other_type {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "embed" : tensor<4x4xf32>
    // expected-error@+1 {{is tied to 'embed' of type 'tensor<4x4xf32>' but has type 'tensor<4x4xbf16>'}}
    fsdp.param "head" : tensor<4x4xbf16> tied_to "embed"
  }
}

// -----

fsdp.model @tie_other_trainability {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "embed" : tensor<4x4xf32>
    // expected-error@+1 {{is tied to 'embed' but differs from it in requires_grad}}
    fsdp.param "head" : tensor<4x4xf32> frozen tied_to "embed"
  }
}

// -----

fsdp.model @tie_across_units {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "embed" : tensor<4x4xf32>
    fsdp.module "head" fully_shard <[shard], main_params = f32> {
      // expected-error@+1 {{is tied to 'embed', which belongs to another fully_shard unit}}
      fsdp.param "weight" : tensor<4x4xf32> tied_to "embed"
    }
  }
}

// -----

fsdp.model @unowned {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    fsdp.module "layer" {
      // expected-error@+1 {{'layer.weight' is trainable but no enclosing module is a fully_shard unit}}
      fsdp.param "weight" : tensor<4x4xf32>
    }
  }
}

// -----

fsdp.model @param_outside_module {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{'fsdp.param' op expects parent op 'fsdp.module'}}
  fsdp.param "w" : tensor<4xf32> frozen
}

// -----

fsdp.model @betas_count {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{betas must have exactly 2 values, got 3}}
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.99, 0.999], eps = 1.0e-8, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @beta_range {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{betas must lie in [0, 1), got 1}}
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 1.0], eps = 1.0e-8, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @negative_lr {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{lr must be a non-negative number, got -1}}
  fsdp.optimizer adam lr = -1.0, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @negative_eps {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{eps must be a non-negative number, got -1}}
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], eps = -1.0, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @negative_decay {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{weight_decay must be a non-negative number, got -5.000000e-01}}
  fsdp.optimizer adamw lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = -0.5, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @integer_state {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{optimizer state dtype must be one of f64, f32, bf16, f16, got 'i32'}}
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = 0.0, state = i32
  fsdp.module "" {
  }
}

// -----

fsdp.model @too_many_ranks {
  // expected-error@+1 {{mesh has more than 16777216 ranks}}
  fsdp.mesh @mesh ["a" = 4611686018427387905, "b" = 4]
  fsdp.module "" {
  }
}

// -----

fsdp.model @adam_without_eps {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{adam needs betas and eps}}
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @adam_momentum {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{adamw has no 'momentum' hyper-parameter}}
  fsdp.optimizer adamw lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, momentum = 0.9, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @adam_nesterov {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{adam has no 'nesterov' hyper-parameter}}
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, nesterov, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @sgd_betas {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{sgd has no 'betas' hyper-parameter}}
  fsdp.optimizer sgd lr = 1.0e-1, betas = [0.9, 0.999], momentum = 0.9, dampening = 0.0, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @sgd_amsgrad {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{sgd has no 'amsgrad' hyper-parameter}}
  fsdp.optimizer sgd lr = 1.0e-1, amsgrad, momentum = 0.9, dampening = 0.0, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @sgd_without_dampening {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{sgd needs momentum and dampening}}
  fsdp.optimizer sgd lr = 1.0e-1, momentum = 0.9, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @sgd_negative_momentum {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{momentum must be a non-negative number, got -5.000000e-01}}
  fsdp.optimizer sgd lr = 1.0e-1, momentum = -0.5, dampening = 0.0, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// -----

fsdp.model @sgd_nesterov_dampening {
  fsdp.mesh @mesh ["dp" = 2]
  // expected-error@+1 {{nesterov needs a momentum and zero dampening}}
  fsdp.optimizer sgd lr = 1.0e-1, momentum = 0.9, dampening = 0.1, nesterov, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}
