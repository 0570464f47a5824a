// RUN: fsdp-translate --import-model-json %examples/worked-example.json | fsdp-opt --fsdp-lower-fully-shard | FileCheck %s
// RUN: fsdp-translate --import-model-json %examples/worked-example.json | fsdp-opt --fsdp-lower-fully-shard --verify-roundtrip > /dev/null
// RUN: fsdp-translate --import-model-json %examples/worked-example-hsdp.json | fsdp-opt --fsdp-lower-fully-shard | FileCheck %s --check-prefix=HSDP
// RUN: fsdp-translate --import-model-json %examples/worked-example-hfsdp.json | fsdp-opt --fsdp-lower-fully-shard | FileCheck %s --check-prefix=HFSDP
// RUN: fsdp-translate --import-model-json %examples/llama3-8b.json | fsdp-opt --fsdp-lower-fully-shard | FileCheck %s --check-prefix=LLAMA
// RUN: fsdp-translate --import-model-json %examples/llama3-8b-hsdp.json | fsdp-opt --fsdp-lower-fully-shard | FileCheck %s --check-prefix=LLAMA-HSDP

// The worked example (docs/MegatronFSDPLayout.md), line by line: chunk 12,
// size 48, P0 at 0 (rows 0-3 on rank 0, row 4 on rank 1), P2 at 20 (row 0 on
// rank 1 at local element 8, rows 1-3 on rank 2), P1 at 36 (all on rank 3).
// CHECK:      fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32, main_grads = bf16>
// CHECK-SAME:   chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36]
// CHECK-SAME:   buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>, #fsdp.buffer<exp_avg : f32>, #fsdp.buffer<exp_avg_sq : f32>] {
// CHECK-NEXT:   fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
// CHECK-NEXT:   fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
// CHECK-NEXT:   fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
// CHECK-NEXT: }
// CHECK-NOT:  fsdp.param_group

// Under HSDP and HFSDP the layout is unchanged (size 48); HSDP inner rank i
// owns 24 elements.
// HSDP:      chunk 12 size 48 shard_size 24 ranks [0, 24, 0, 24]
// HSDP-NEXT:   fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 5) at 0]
// HSDP-NEXT:   fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [1: [0, 7) at 12]
// HSDP-NEXT:   fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [0: [0, 1) at 20, 1: [1, 4) at 0]
// HFSDP:      chunk 12 size 48 shard_size 12 ranks [0, 24, 12, 36]
// HFSDP-NEXT:   fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
// HFSDP-NEXT:   fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
// HFSDP-NEXT:   fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]

// Llama-3-8B on 8 ranks: the root group (embeddings, final norm, head) and
// one group per decoder layer, chunk = lcm(4096, 14336) = 28672. Root:
// embed (525336576 elements) at 0, norm at 525336576, head at 525340672,
// size = roundup(1050677248, 4096 x 8) = 1050705920, 32065 rows per rank.
// LLAMA:      fsdp.param_group @group0 unit "" : bf16
// LLAMA-SAME:   chunk 4096 size 1050705920 shard_size 131338240 ranks [0, 131338240, 262676480, 394014720, 525352960, 656691200, 788029440, 919367680]
// LLAMA-NEXT:   fsdp.member ["model.embed_tokens.weight"] : tensor<128256x4096xbf16> offset 0 pieces [0: [0, 32065) at 0, 1: [32065, 64130) at 0, 2: [64130, 96195) at 0, 3: [96195, 128256) at 0]
// LLAMA-NEXT:   fsdp.member ["model.norm.weight"] : tensor<4096xbf16> offset 525336576 pieces [3: [0, 4096) at 131321856]
// LLAMA-NEXT:   fsdp.member ["lm_head.weight"] : tensor<128256x4096xbf16> offset 525340672 pieces [3: [0, 3) at 131325952, 4: [3, 32068) at 0,
// LLAMA:      fsdp.param_group @group1 unit "model.layers.0" : bf16 policy <[shard], main_params = f32> chunk 28672 size 218136576 shard_size 27267072
// LLAMA:      fsdp.param_group @group32 unit "model.layers.31"
// LLAMA-NOT:  fsdp.param_group
// LLAMA-HSDP: fsdp.param_group @group1 unit "model.layers.0" : bf16 policy <[replicate, shard], main_params = f32> chunk 28672 size 218136576 shard_size 54534144 ranks [0, 54534144, 109068288, 163602432, 0, 54534144, 109068288, 163602432]
