// A tied parameter is one span carrying all its FQNs; FQNs are XML-escaped;
// a frozen group is drawn as its own bar.
// RUN: fsdp-translate --emit-layout-svg %s | FileCheck %s

module {
  fsdp.model @model {
    fsdp.mesh @mesh ["dp" = 2]
    fsdp.module "" fully_shard <[shard], main_params = f32> {
      fsdp.param "w<&>\22'" : tensor<6x2xf32>
      fsdp.module "embed" {
        fsdp.param "weight" : tensor<10x4xf32>
      }
      fsdp.module "head" {
        fsdp.param "weight" : tensor<10x4xf32> tied_to "embed.weight"
        fsdp.param "bias" : tensor<3xf32>
      }
      fsdp.module "frozen" {
        fsdp.param "mask" : tensor<5xi1> frozen
      }
    }
    fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> chunk 4 size 56 shard_size 28 ranks [0, 28] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : f32, aliases main_weight>, #fsdp.buffer<main_grad : f32>] {
      fsdp.member ["w<&>\22'"] : tensor<6x2xf32> offset 0 pieces [0: [0, 6) at 0]
      fsdp.member ["embed.weight", "head.weight"] : tensor<10x4xf32> offset 12 pieces [0: [0, 4) at 12, 1: [4, 10) at 0]
      fsdp.member ["head.bias"] : tensor<3xf32> offset 52 pieces [1: [0, 3) at 24]
    }
    fsdp.param_group @group1 unit "" : i1 frozen policy <[shard], main_params = f32> chunk 1 size 6 shard_size 3 ranks [0, 3] buffers [#fsdp.buffer<main_weight : i1>, #fsdp.buffer<model_weight : i1, aliases main_weight>] {
      fsdp.member ["frozen.mask"] : tensor<5xi1> offset 0 pieces [0: [0, 3) at 0, 1: [3, 5) at 0]
    }
  }
}

// CHECK:      mesh dp=2 (2 ranks)  ·  2 groups
// CHECK:      @group0  ·  unit (root)  ·  f32  ·  chunk 4  ·  size 56  ·  2 shards of 28
// CHECK-SAME: {{$}}
// CHECK:      buffers main_weight f32, model_weight f32 (= main_weight), main_grad f32
// CHECK:      class="member"><title>#2 embed.weight = head.weight (tied) : tensor&lt;10x4xf32&gt;
// CHECK-NEXT: elements [12, 52), 40
// CHECK-NEXT: shard 0 (rank 0): rows [0, 4) at local offset 12
// CHECK-NEXT: shard 1 (rank 1): rows [4, 10) at local offset 0</title></rect>
// CHECK:      class="member"><title>#1 w&lt;&amp;&gt;&quot;&apos; : tensor&lt;6x2xf32&gt;
// CHECK:      >w&lt;&amp;&gt;&quot;&apos;</text>
// CHECK:      >embed.weight = head.weight</text>
// The tail padding [55, 56) is under 1 px of label room: a callout.
// CHECK:      class="callout" text-anchor="end">padding 1</text>
// CHECK:      class="td">embed.weight = head.weight (tied)</text>
// CHECK:      @group1  ·  unit (root)  ·  bool (frozen)  ·  chunk 1  ·  size 6  ·  2 shards of 3
// CHECK:      >frozen.mask</text>
