// RUN: fsdp-opt %s -split-input-file -verify-diagnostics

// Hand-written wrong layouts, each rejected by the verifier with a diagnostic.
// The base layout is the worked example of docs/MegatronFSDPLayout.md on 4
// ranks.

// Two tensors overlap.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{invalid packed layout: member 'p2' at [12, 28) overlaps member 'p0' at [0, 15)}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 12
  }
}

// -----

// An offset that is not a whole number of rows.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{invalid packed layout: member 'p2': offset 22 is not a multiple of its row size 4}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 22
  }
}

// -----

// A size not padded to chunk x mesh size.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{invalid packed layout: layout size 44 is not a multiple of chunk * mesh size = 12 * 4}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 44 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
  }
}

// -----

// A tensor past the end of the buffer.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{invalid packed layout: member 'p1': its 7 elements at offset 44 run past the buffer size 48}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    fsdp.member ["p1"] : tensor<7xbf16> offset 44
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
  }
}

// -----

// A chunk that is not a multiple of every row size.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{invalid packed layout: member 'p0': chunk 8 is not a multiple of its row size 3}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 8 size 64 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
  }
}

// -----

// A valid tiling that is not Megatron-FSDP's packing.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    // expected-error@+1 {{member 'p1' at offset 16 differs from Megatron-FSDP's packing, which puts it at 36}}
    fsdp.member ["p1"] : tensor<7xbf16> offset 16
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 24
  }
}

// -----

// A rank range the mesh does not give.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{rank 1 range begins at 24, but the mesh and placements put it at 12}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 24, 12, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// Too few rank ranges.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{ranks lists 3 ranges but mesh @mesh has 4 ranks}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// A shard size that does not split the buffer.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{shard_size 16 does not split size 48 into 4 shards (expected 12)}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 16 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// Pieces that leave rows uncovered.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    // expected-error@+1 {{member 'p0' pieces leave rows [4, 5) uncovered}}
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// Pieces with a gap.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    // expected-error@+1 {{member 'p2' piece 2: [2, 4) at 4 leaves rows [1, 2) uncovered}}
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [2, 4) at 4]
  }
}

// -----

// Pieces that overlap.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    // expected-error@+1 {{member 'p0' piece 1: [3, 5) at 0 overlaps rows [3, 4) twice}}
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [3, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// A piece outside its rank's range.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    // expected-error@+1 {{member 'p0' piece 0: [0, 5) at 0 lies outside its shard's range [0, 12)}}
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// A piece at the wrong local offset.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    // expected-error@+1 {{member 'p2' piece 1: [0, 1) at 4 has local offset 4 but the member's offset puts it at 8}}
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 4, 2: [1, 4) at 0]
  }
}

// -----

// Pieces out of shard order.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    // expected-error@+1 {{member 'p2' piece 1: [1, 4) at 0 names shard 1, expected shards in increasing order below 4}}
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 1: [1, 4) at 0]
  }
}

// -----

// A piece that names a shard past the mesh.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    // expected-error@+1 {{member 'p1' piece 4: [0, 7) at 0 names shard 4, expected shards in increasing order below 4}}
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [4: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// An assigned group without pieces.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    // expected-error@+1 {{member 'p1' has no pieces in an assigned group}}
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// Pieces stored in the wrong arity.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    // expected-error@+1 {{pieces must hold four numbers each}}
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 {pieces = array<i64: 3, 0, 7>}
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// A member without an offset in a packed group.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 {
    // expected-error@+1 {{member 'p0' has no offset in a packed group}}
    fsdp.member ["p0"] : tensor<5x3xbf16>
    fsdp.member ["p1"] : tensor<7xbf16> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
  }
}

// -----

// Rank ranges on an unpacked group.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{rank ranges need a packed group (chunk, size)}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> shard_size 12 ranks [0, 12, 24, 36] {
    fsdp.member ["p0"] : tensor<5x3xbf16>
    fsdp.member ["p1"] : tensor<7xbf16>
    fsdp.member ["p2"] : tensor<4x4xbf16>
  }
}

// -----

// A member of another element type.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0
    // expected-error@+1 {{member 'p1' has element type 'f32' but group @group0 holds 'bf16'}}
    fsdp.member ["p1"] : tensor<7xf32> offset 36
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20
  }
}

// -----

// A buffer listed twice.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{lists buffer main_weight twice}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<main_weight : f32>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// No main weights.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{has no main_weight buffer}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<model_weight : bf16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// Model weights in another dtype.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{model_weight buffer has dtype 'f16' but the group holds 'bf16'}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : f16>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// An alias between buffers of different dtypes.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  // expected-error@+1 {{model_weight aliases main_weight exactly when their dtypes match}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16, aliases main_weight>] {
    fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
    fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
    fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
  }
}

// -----

// A member naming no parameter.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["w"] : tensor<4xf32>
    // expected-error@+1 {{names unknown parameter 'v'}}
    fsdp.member ["v"] : tensor<4xf32>
  }
}

// -----

// A group naming no unit.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{names unit "layers.0", which is not a fully_shard module}}
  fsdp.param_group @group0 unit "layers.0" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["w"] : tensor<4xf32>
  }
}

// -----

// A group whose policy differs from its unit's.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{differs from unit ""'s}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = bf16> {
    fsdp.member ["w"] : tensor<4xf32>
  }
}

// -----

// A member whose type differs from its parameter's.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-error@+1 {{has type 'tensor<8xf32>' but 'w' has type 'tensor<4xf32>'}}
    fsdp.member ["w"] : tensor<8xf32>
  }
}

// -----

// A parameter listed twice.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-note@+1 {{first listed here}}
    fsdp.member ["w"] : tensor<4xf32>
    // expected-error@+1 {{'w' is already a member}}
    fsdp.member ["w"] : tensor<4xf32>
  }
}

// -----

// A parameter owned by another unit.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.module "a" fully_shard <[shard], main_params = f32> {
      fsdp.param "w" : tensor<4xf32>
    }
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-error@+1 {{'a.w' is not owned by unit ""}}
    fsdp.member ["a.w"] : tensor<4xf32>
  }
}

// -----

// A parameter in no group once grouped.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
    // expected-error@+1 {{'v' is in no parameter group of its unit}}
    fsdp.param "v" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["w"] : tensor<4xf32>
  }
}

// -----

// A trainable member in a frozen group.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 frozen policy <[shard], main_params = f32> {
    // expected-error@+1 {{'w' differs from its group in requires_grad}}
    fsdp.member ["w"] : tensor<4xf32>
  }
}

// -----

// A member listing one FQN twice.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-error@+1 {{lists FQN 'w' twice}}
    fsdp.member ["w", "w"] : tensor<4xf32>
  }
}

// -----

// Chunk without size.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{chunk and size must be given together}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 1 {
    fsdp.member ["w"] : tensor<4xf32> offset 0
  }
}

// -----

// Ranks without a shard size.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{shard_size and ranks must be given together}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 1 size 4 ranks [0, 2] {
    fsdp.member ["w"] : tensor<4xf32> offset 0 pieces [0: [0, 2) at 0, 1: [2, 4) at 0]
  }
}

// -----

// Over-padding tiles the tensors but is not Megatron-FSDP's size.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{layout differs from Megatron-FSDP's packing: chunk 1 size 8, expected chunk 1 size 4}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 1 size 8 {
    fsdp.member ["w"] : tensor<4xf32> offset 0
  }
}

// -----

// A group policy that does not fit the mesh.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{policy does not fit mesh @mesh: mesh has 1 axes but 2 placements}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard, shard], main_params = f32> {
    fsdp.member ["w"] : tensor<4xf32>
  }
}

// -----

// An empty piece, and one past the tensor's rows.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 1 size 4 shard_size 2 ranks [0, 2] {
    // expected-error@+1 {{member 'w' piece 1: [2, 2) at 0 is not a non-empty row range inside [0, 4)}}
    fsdp.member ["w"] : tensor<4xf32> offset 0 pieces [0: [0, 2) at 0, 1: [2, 2) at 0]
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 1 size 4 shard_size 2 ranks [0, 2] {
    // expected-error@+1 {{member 'w' piece 1: [2, 6) at 0 is not a non-empty row range inside [0, 4)}}
    fsdp.member ["w"] : tensor<4xf32> offset 0 pieces [0: [0, 2) at 0, 1: [2, 6) at 0]
  }
}

// -----

// A buffer of an unsupported dtype.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{buffer main_grad has unsupported dtype 'f8E5M2'}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 1 size 4 shard_size 2 ranks [0, 2] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<main_grad : f8E5M2>] {
    fsdp.member ["w"] : tensor<4xf32> offset 0 pieces [0: [0, 2) at 0, 1: [2, 4) at 0]
  }
}

// -----

// Members: no FQN, a negative offset, a shape that cannot be packed.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-error@+1 {{needs at least one FQN}}
    fsdp.member [] : tensor<4xf32>
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-error@+1 {{member 'w' has negative offset -4}}
    fsdp.member ["w"] : tensor<4xf32> offset -4
  }
}

// -----

fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-error@+1 {{member 'w' needs a static shape of positive dimensions, got 'tensor<?x4xf32>'}}
    fsdp.member ["w"] : tensor<?x4xf32>
  }
}

// -----

// The generic form can give a mesh mismatched names and sizes.
fsdp.model @m {
  // expected-error@+1 {{mesh has 2 axis names but 1 sizes}}
  "fsdp.mesh"() <{sym_name = "mesh", axis_names = ["a", "b"], shape = array<i64: 2>}> : () -> ()
  fsdp.module "" {
  }
}

// -----

// Members out of named_parameters() order: p2 is listed before p0.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> {
    // expected-error@+1 {{member 0 of group @group0 must be [p0]: members follow named_parameters() order}}
    fsdp.member ["p2"] : tensor<4x4xbf16>
    fsdp.member ["p0"] : tensor<5x3xbf16>
  }
}

// -----

// Two untied parameters merged into one member.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "a" : tensor<4xf32>
    fsdp.param "b" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-error@+1 {{member 0 of group @group0 must be [a]: members follow named_parameters() order and only tied parameters share a member}}
    fsdp.member ["a", "b"] : tensor<4xf32>
  }
}

// -----

// One unit's (f32, trainable) parameters split over two groups.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "a" : tensor<4xf32>
    fsdp.param "b" : tensor<4xf32>
  }
  // expected-error@+1 {{unit "" has 2 parameter groups but its parameters form 1 (one per dtype and requires_grad)}}
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["a"] : tensor<4xf32>
  }
  fsdp.param_group @group1 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["b"] : tensor<4xf32>
  }
}

// -----

// Groups out of first-occurrence order.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "a" : tensor<4xf32>
    fsdp.param "b" : tensor<4xbf16>
  }
  // expected-error@+1 {{groups of unit "" must follow the first occurrence of each (dtype, requires_grad); expected 'f32' here}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> {
    fsdp.member ["b"] : tensor<4xbf16>
  }
  fsdp.param_group @group1 unit "" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["a"] : tensor<4xf32>
  }
}

// -----

// A group without members.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
  }
  // expected-error@+1 {{has no members}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 1 size 0 shard_size 0 ranks [0, 0] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>] {
  }
}

// -----

// Buffers the policy and the optimizer do not give: main weights must be f32.
fsdp.model @m {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = 0.0, state = f32
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "a" : tensor<4xbf16>
  }
  // expected-error@+1 {{buffers [#fsdp.buffer<main_weight : i8>, #fsdp.buffer<model_weight : bf16>] differ from what the policy and the optimizer give: [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>, #fsdp.buffer<exp_avg : f32>, #fsdp.buffer<exp_avg_sq : f32>]}}
  fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32> chunk 1 size 4 shard_size 2 ranks [0, 2] buffers [#fsdp.buffer<main_weight : i8>, #fsdp.buffer<model_weight : bf16>] {
    fsdp.member ["a"] : tensor<4xbf16> offset 0 pieces [0: [0, 2) at 0, 1: [2, 4) at 0]
  }
}
