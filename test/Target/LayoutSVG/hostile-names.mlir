// Names are any bytes: markup characters, control characters (ESC, BEL, a
// newline, CR, NUL, DEL, C1), noncharacters (U+FFFF, U+FFFE, U+FDD0,
// U+1FFFF) and invalid UTF-8 (a stray byte, a truncated sequence, a
// surrogate, a code point past U+10FFFF). The SVG stays well-formed XML, the
// layout JSON valid JSON, and diagnostics one line.
// RUN: fsdp-opt --fsdp-lower-fully-shard %s -o %t.mlir
// RUN: fsdp-translate --emit-layout-svg %t.mlir -o %t.svg
// RUN: python3 -c "import sys, xml.etree.ElementTree as ET; ET.parse(sys.argv[1])" %t.svg
// RUN: FileCheck %s < %t.svg
// RUN: fsdp-translate --emit-layout-json %t.mlir | python3 -c "import sys, json; json.load(sys.stdin)"
// RUN: not fsdp-translate --emit-layout-svg --layout-svg-unit=nope %t.mlir 2>&1 | FileCheck %s --check-prefix=UNIT

// CHECK: <title>fsdp.model @m\x1b]0;t\x07&lt;&amp;&gt;&quot;&apos;\u{FFFF}\xff: packed parameter-group layout</title>
// CHECK: class="note">mesh d\x1b
// CHECK-NEXT: p\u{FFFE}=2 (2 ranks)
// CHECK: class="td">w\x1b[2J\x07
// CHECK-NEXT: \x0d&lt;&amp;&gt;&quot;&apos;\u{FFFF}\u{FFFE}\u{FDD0}\u{0085}\xff\xc3(\xed\xa0\x80\xf4\x90\x80\x80層</text>
// CHECK: class="td">u\x00\x1f\x7f.x\u{1FFFF}</text>

// UNIT: error: no fsdp.param_group of unit 'nope' (units: (root), u\x00\x1f\x7f){{$}}

module {
  fsdp.model @"m\1B]0;t\07<&>\22'\EF\BF\BF\FF" {
    fsdp.mesh @mesh ["d\1B\0Ap\EF\BF\BE" = 2]
    fsdp.module "" fully_shard <[shard], main_params = f32> {
      fsdp.param "w\1B[2J\07\0A\0D<&>\22'\EF\BF\BF\EF\BF\BE\EF\B7\90\C2\85\FF\C3\28\ED\A0\80\F4\90\80\80\E5\B1\A4" : tensor<4x3xf32>
      fsdp.module "u\00\1F\7F" fully_shard <[shard], main_params = f32> {
        fsdp.param "x\F0\9F\BF\BF" : tensor<8xf32>
      }
    }
  }
}
