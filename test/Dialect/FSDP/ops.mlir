// RUN: fsdp-opt %s | FileCheck %s
// RUN: fsdp-opt %s | fsdp-opt | FileCheck %s
// RUN: fsdp-opt %s --verify-roundtrip > /dev/null

// CHECK-LABEL: fsdp.model @fsdp
// CHECK-NEXT:    fsdp.mesh @mesh ["dp" = 4]
// CHECK-NEXT:    fsdp.optimizer adamw lr = 1.000000e-03, betas = [9.000000e-01, 9.990000e-01], eps = 1.000000e-08, weight_decay = 1.000000e-02, state = f32
// CHECK-NEXT:    fsdp.module "" fully_shard <[shard], main_params = f32, main_grads = bf16> {
// CHECK-NEXT:      fsdp.param "p0" : tensor<5x3xbf16>
// CHECK-NEXT:      fsdp.param "p1" : tensor<7xbf16>
// CHECK-NEXT:      fsdp.param "p2" : tensor<4x4xbf16>
// CHECK-NEXT:    }
fsdp.model @fsdp {
  fsdp.mesh @mesh ["dp" = 4]
  fsdp.optimizer adamw lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, weight_decay = 0.01, state = f32
  fsdp.module "" fully_shard <[shard], main_params = f32, main_grads = bf16> {
    fsdp.param "p0" : tensor<5x3xbf16>
    fsdp.param "p1" : tensor<7xbf16>
    fsdp.param "p2" : tensor<4x4xbf16>
  }
}

// A module tree with nested units, HSDP placements, every supported element
// type, a frozen parameter and a tie; no optimizer.
// CHECK-LABEL: fsdp.model @tree
// CHECK:         fsdp.mesh @mesh ["dp_outer" = 2, "dp_shard" = 4]
// CHECK:         fsdp.module "" fully_shard <[replicate, shard], main_params = f32> {
// CHECK-NEXT:      fsdp.param "embed" : tensor<16x8xbf16>
// CHECK-NEXT:      fsdp.module "layers" {
// CHECK-NEXT:        fsdp.module "0" fully_shard <[shard, shard], main_params = bf16, main_grads = f32> {
// CHECK-NEXT:          fsdp.param "w64" : tensor<2xf64>
// CHECK-NEXT:          fsdp.param "w16" : tensor<2x3x4xf16>
// CHECK-NEXT:          fsdp.param "i" : tensor<3xi64> frozen
// CHECK-NEXT:          fsdp.param "i32" : tensor<3xi32> frozen
// CHECK-NEXT:          fsdp.param "i16" : tensor<3xi16> frozen
// CHECK-NEXT:          fsdp.param "i8" : tensor<3xi8> frozen
// CHECK-NEXT:          fsdp.param "u8" : tensor<3xui8> frozen
// CHECK-NEXT:          fsdp.param "mask" : tensor<3xi1> frozen
// CHECK-NEXT:        }
// CHECK-NEXT:      }
// CHECK-NEXT:      fsdp.param "head" : tensor<16x8xbf16> tied_to "embed"
// CHECK-NEXT:    }
fsdp.model @tree {
  fsdp.mesh @mesh ["dp_outer" = 2, "dp_shard" = 4]
  fsdp.module "" fully_shard <[replicate, shard], main_params = f32> {
    fsdp.param "embed" : tensor<16x8xbf16>
    fsdp.module "layers" {
      fsdp.module "0" fully_shard <[shard, shard], main_params = bf16, main_grads = f32> {
        fsdp.param "w64" : tensor<2xf64>
        fsdp.param "w16" : tensor<2x3x4xf16>
        fsdp.param "i" : tensor<3xi64> frozen
        fsdp.param "i32" : tensor<3xi32> frozen
        fsdp.param "i16" : tensor<3xi16> frozen
        fsdp.param "i8" : tensor<3xi8> frozen
        fsdp.param "u8" : tensor<3xui8> frozen
        fsdp.param "mask" : tensor<3xi1> frozen
      }
    }
    fsdp.param "head" : tensor<16x8xbf16> tied_to "embed"
  }
}

// Frozen parameters need no fully_shard unit.
// CHECK-LABEL: fsdp.model @frozen
// CHECK:         fsdp.optimizer adam lr = 2.000000e-02
// CHECK:         fsdp.param "buffer" : tensor<4xf32> frozen
fsdp.model @frozen {
  fsdp.mesh @mesh ["dp" = 1]
  fsdp.optimizer adam lr = 0.02, betas = [0.8, 0.9], eps = 1.0e-6, weight_decay = 0.0, state = bf16
  fsdp.module "" {
    fsdp.param "buffer" : tensor<4xf32> frozen
  }
}

// Adam with amsgrad and SGD with Nesterov momentum round-trip.
// CHECK-LABEL: fsdp.model @amsgrad
// CHECK:         fsdp.optimizer adam lr = 1.000000e-03, betas = [9.000000e-01, 9.990000e-01], eps = 1.000000e-08, amsgrad, weight_decay = 0.000000e+00, state = f32
fsdp.model @amsgrad {
  fsdp.mesh @mesh ["dp" = 1]
  fsdp.optimizer adam lr = 1.0e-3, betas = [0.9, 0.999], eps = 1.0e-8, amsgrad, weight_decay = 0.0, state = f32
  fsdp.module "" {
  }
}

// CHECK-LABEL: fsdp.model @sgd
// CHECK:         fsdp.optimizer sgd lr = 1.000000e-01, momentum = 9.000000e-01, dampening = 0.000000e+00, nesterov, weight_decay = 1.000000e-04, state = bf16
fsdp.model @sgd {
  fsdp.mesh @mesh ["dp" = 1]
  fsdp.optimizer sgd lr = 0.1, momentum = 0.9, dampening = 0.0, nesterov, weight_decay = 1.0e-4, state = bf16
  fsdp.module "" {
  }
}
