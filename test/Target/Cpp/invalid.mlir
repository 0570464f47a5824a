// RUN: fsdp-translate --emit-cpp %s -split-input-file -verify-diagnostics -o %t.cpp

// A model that was never lowered has no layout to embed.
// expected-error @+1 {{--emit-cpp needs a lowered model; run fsdp-opt --fsdp-lower-fully-shard first}}
fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4x3xbf16>
  }
}

// -----

// expected-error @+1 {{expected exactly one 'fsdp.model', found 0}}
module {
}
