// The layout picture of the worked example (docs/MegatronFSDPLayout.md):
// chunk 12, size 48 on 4 ranks, bar 1200 px wide from x = 40 (25 px per
// element).
// Buffer: [0,15) p0 · [15,20) hole · [20,36) p2 · [36,43) p1 · [43,48) pad.
// RUN: fsdp-translate --emit-layout-svg %s | FileCheck %s
// RUN: fsdp-translate --emit-layout-svg --layout-svg-unit='(root)' %s | FileCheck %s
// RUN: fsdp-translate --emit-layout-svg %s | FileCheck %s --check-prefix=SAFE
// The unit filter names a unit; an unknown one is an error naming the units.
// RUN: not fsdp-translate --emit-layout-svg --layout-svg-unit=model.layers.0 %s 2>&1 | FileCheck %s --check-prefix=UNIT
// The HSDP variant: two shards of 24, each held by two ranks.
// RUN: fsdp-translate --import-model-json %examples/worked-example-hsdp.json | fsdp-opt --fsdp-lower-fully-shard | fsdp-translate --emit-layout-svg | FileCheck %s --check-prefix=HSDP
// HFSDP has four shards; shard 1 is held by rank 2 (coordinates (1, 0)).
// RUN: fsdp-translate --import-model-json %examples/worked-example-hfsdp.json | fsdp-opt --fsdp-lower-fully-shard | fsdp-translate --emit-layout-svg | FileCheck %s --check-prefix=HFSDP

module {
  fsdp.model @model {
    fsdp.mesh @mesh ["dp" = 4]
    fsdp.optimizer adamw lr = 1.000000e-03, betas = [9.000000e-01, 9.990000e-01], eps = 1.000000e-08, weight_decay = 1.000000e-02, state = f32
    fsdp.module "" fully_shard <[shard], main_params = f32, main_grads = bf16> {
      fsdp.param "p0" : tensor<5x3xbf16>
      fsdp.param "p1" : tensor<7xbf16>
      fsdp.param "p2" : tensor<4x4xbf16>
    }
    fsdp.param_group @group0 unit "" : bf16 policy <[shard], main_params = f32, main_grads = bf16> chunk 12 size 48 shard_size 12 ranks [0, 12, 24, 36] buffers [#fsdp.buffer<main_weight : f32>, #fsdp.buffer<model_weight : bf16>, #fsdp.buffer<main_grad : bf16>, #fsdp.buffer<exp_avg : f32>, #fsdp.buffer<exp_avg_sq : f32>] {
      fsdp.member ["p0"] : tensor<5x3xbf16> offset 0 pieces [0: [0, 4) at 0, 1: [4, 5) at 0]
      fsdp.member ["p1"] : tensor<7xbf16> offset 36 pieces [3: [0, 7) at 0]
      fsdp.member ["p2"] : tensor<4x4xbf16> offset 20 pieces [1: [0, 1) at 8, 2: [1, 4) at 0]
    }
  }
}

// CHECK:      <svg xmlns="http://www.w3.org/2000/svg"
// CHECK:      mesh dp=4 (4 ranks)
// CHECK:      @group0  ·  unit (root)  ·  bf16  ·  chunk 12  ·  size 48  ·  4 shards of 12
// CHECK:      placements [shard] over mesh dp=4  ·  buffers main_weight f32, model_weight bf16, main_grad bf16, exp_avg f32, exp_avg_sq f32

// The band: one shaded strip per shard (its tooltip names the ranks).
// CHECK:      <title>shard 0: elements [0, 12) held by rank 0</title>
// CHECK:      <title>shard 1: elements [12, 24) held by rank 1</title>
// CHECK:      <title>shard 2: elements [24, 36) held by rank 2</title>
// CHECK:      <title>shard 3: elements [36, 48) held by rank 3</title>

// Spans to scale, each with a tooltip (FQN, type, range, pieces).
// CHECK:      <rect x="40" y="60" width="1200" height="44" class="bar"/>
// CHECK-DAG:  <rect x="415" y="60" width="125" height="44" fill="url(#hole)" class="gap"><title>hole (never read): elements [15, 20), 5</title></rect>
// CHECK-DAG:  <rect x="1115" y="60" width="125" height="44" fill="#8c8c8c" class="gap"><title>tail padding (never read): elements [43, 48), 5</title></rect>
// CHECK-DAG:  <rect x="40" y="60" width="375" height="44" fill="#8dd3c7" class="member"><title>#1 p0 : tensor&lt;5x3xbf16&gt;
// CHECK-DAG:  <rect x="540" y="60" width="400" height="44" fill="#80b1d3" class="member"><title>#2 p2 : tensor&lt;4x4xbf16&gt;
// CHECK-DAG:  <rect x="940" y="60" width="175" height="44" fill="#fb8072" class="member"><title>#3 p1 : tensor&lt;7xbf16&gt;
// CHECK-DAG:  elements [0, 15), 15
// CHECK-DAG:  shard 0 (rank 0): rows [0, 4) at local offset 0
// CHECK-DAG:  shard 1 (rank 1): rows [4, 5) at local offset 0
// CHECK-DAG:  elements [20, 36), 16
// CHECK-DAG:  shard 1 (rank 1): rows [0, 1) at local offset 8
// CHECK-DAG:  shard 2 (rank 2): rows [1, 4) at local offset 0
// CHECK-DAG:  elements [36, 43), 7
// CHECK-DAG:  shard 3 (rank 3): rows [0, 7) at local offset 0

// Shard boundaries at elements 0, 12, 24, 36 and 48.
// CHECK:      <line x1="40" y1="40" x2="40" y2="110" class="shard"/>
// CHECK-NEXT: <line x1="340" y1="40" x2="340" y2="110" class="shard"/>
// CHECK-NEXT: <line x1="640" y1="40" x2="640" y2="110" class="shard"/>
// CHECK-NEXT: <line x1="940" y1="40" x2="940" y2="110" class="shard"/>
// CHECK-NEXT: <line x1="1240" y1="40" x2="1240" y2="110" class="shard"/>

// Over the band, the rank holding each shard.
// CHECK-NEXT: <text x="190" y="53" class="rank" text-anchor="middle" {{.*}}>rank 0</text>
// CHECK-NEXT: <text x="490" y="53" class="rank" text-anchor="middle" {{.*}}>rank 1</text>
// CHECK-NEXT: <text x="790" y="53" class="rank" text-anchor="middle" {{.*}}>rank 2</text>
// CHECK-NEXT: <text x="1090" y="53" class="rank" text-anchor="middle" {{.*}}>rank 3</text>

// In-bar labels: the FQN and the element range of every span.
// CHECK:      class="inbar" text-anchor="middle" stroke="#8dd3c7">p0</text>
// CHECK-NEXT: class="detail" text-anchor="middle" stroke="#8dd3c7">[0, 15)</text>
// CHECK-NEXT: class="inbar" text-anchor="middle" stroke="#e6e6e6">hole</text>
// CHECK-NEXT: class="detail" text-anchor="middle" stroke="#e6e6e6">[15, 20)</text>
// CHECK-NEXT: class="inbar" text-anchor="middle" stroke="#80b1d3">p2</text>
// CHECK-NEXT: class="detail" text-anchor="middle" stroke="#80b1d3">[20, 36)</text>
// CHECK-NEXT: class="inbar" text-anchor="middle" stroke="#fb8072">p1</text>
// CHECK-NEXT: class="detail" text-anchor="middle" stroke="#fb8072">[36, 43)</text>
// CHECK-NEXT: class="inbar light" text-anchor="middle" stroke="#8c8c8c">padding</text>
// CHECK-NEXT: class="detail light" text-anchor="middle" stroke="#8c8c8c">[43, 48)</text>

// Offsets below the bar: shard boundaries, then span boundaries.
// CHECK-NEXT: <text x="40" y="121" class="offset" text-anchor="middle">0</text>
// CHECK-NEXT: <text x="1240" y="121" class="offset" text-anchor="middle">48</text>
// CHECK-NEXT: <text x="340" y="121" class="offset" text-anchor="middle">12</text>
// CHECK-NEXT: <text x="640" y="121" class="offset" text-anchor="middle">24</text>
// CHECK-NEXT: <text x="940" y="121" class="offset" text-anchor="middle">36</text>
// CHECK:      class="offset minor" text-anchor="middle">15</text>
// CHECK:      class="offset minor" text-anchor="middle">20</text>
// CHECK:      class="offset minor" text-anchor="middle">43</text>

// The table, in buffer order.
// CHECK:      class="td">[0, 15)</text>
// CHECK:      class="td">p0</text>
// CHECK-NEXT: class="td">5x3</text>
// CHECK-NEXT: class="td">0:[0,4)@0 1:[4,5)@0</text>
// CHECK:      class="td">(hole)</text>
// CHECK:      class="td">p2</text>
// CHECK-NEXT: class="td">4x4</text>
// CHECK-NEXT: class="td">1:[0,1)@8 2:[1,4)@0</text>
// CHECK:      class="td">p1</text>
// CHECK-NEXT: class="td">7</text>
// CHECK-NEXT: class="td">3:[0,7)@0</text>
// CHECK:      class="td">(tail padding)</text>
// CHECK:      </svg>

// Standalone: no scripts, no external resources.
// SAFE-NOT:   <script
// SAFE-NOT:   href=
// SAFE-NOT:   @import
// SAFE-NOT:   url(http

// UNIT: error: no fsdp.param_group of unit 'model.layers.0' (units: (root))
// UNIT-NOT: <svg

// HSDP:      size 48  ·  2 shards of 24
// HSDP:      <title>shard 0: elements [0, 24) held by ranks 0, 2</title>
// HSDP:      <title>shard 1: elements [24, 48) held by ranks 1, 3</title>
// HSDP:      >shard 0: ranks 0, 2</text>
// HSDP:      >shard 1: ranks 1, 3</text>
// HSDP:      shard 0 (ranks 0, 2): rows [0, 5) at local offset 0

// HFSDP:      <title>shard 1: elements [12, 24) held by rank 2</title>
// HFSDP:      <title>shard 2: elements [24, 36) held by rank 1</title>
// HFSDP:      >shard 0: rank 0</text>
// HFSDP-NEXT: >shard 1: rank 2</text>
// HFSDP-NEXT: >shard 2: rank 1</text>
// HFSDP-NEXT: >shard 3: rank 3</text>
