// The picture is of a lowered layout: a model straight from the importer,
// or one only partly lowered, is refused with one line saying what to run.
// RUN: not fsdp-translate --emit-layout-svg %s 2>&1 | FileCheck %s
// RUN: fsdp-opt --fsdp-group-params %s | not fsdp-translate --emit-layout-svg 2>&1 | FileCheck %s
// RUN: fsdp-opt --fsdp-group-params --fsdp-pack-param-groups %s | not fsdp-translate --emit-layout-svg 2>&1 | FileCheck %s

// CHECK:     error: --emit-layout-svg needs a lowered model; run fsdp-opt --fsdp-lower-fully-shard first
// CHECK-NOT: see current operation
// CHECK-NOT: <svg

module {
  fsdp.model @model {
    fsdp.mesh @mesh ["dp" = 4]
    fsdp.optimizer adamw lr = 1.000000e-03, betas = [9.000000e-01, 9.990000e-01], eps = 1.000000e-08, weight_decay = 1.000000e-02, state = f32
    fsdp.module "" fully_shard <[shard], main_params = f32, main_grads = bf16> {
      fsdp.param "p0" : tensor<5x3xbf16>
      fsdp.param "p1" : tensor<7xbf16>
      fsdp.param "p2" : tensor<4x4xbf16>
    }
  }
}
