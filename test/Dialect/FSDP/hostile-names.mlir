// Names reach diagnostics through one printer: control characters (ESC,
// BEL, a newline) and invalid UTF-8 are written \xNN (\n for a newline), so
// each error is one line and cannot drive the terminal.
// RUN: fsdp-opt %s -split-input-file -verify-diagnostics
// RUN: not fsdp-opt %s -split-input-file 2>&1 | FileCheck %s
// No control byte but the line ends reaches the terminal.
// RUN: not fsdp-opt %s -split-input-file 2>&1 | python3 -c "import sys; sys.exit(any(b < 32 and b != 10 for b in sys.stdin.buffer.read()))"

// An OSC sequence setting the terminal's title, a screen clear, a newline.
fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    // expected-error@+1 {{parameter name 'a\x1b]0;title\x07\x1b[2J.b\nc\xff' must not contain '.'}}
    fsdp.param "a\1B]0;title\07\1B[2J.b\0Ac\FF" : tensor<4xf32> frozen
  }
}
// CHECK: error: 'fsdp.param' op parameter name 'a\x1b]0;title\x07\x1b[2J.b\nc\xff' must not contain '.' (FQNs are joined with '.'){{$}}

// -----

fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    // expected-error@+1 {{module name 'm\x1b\n.x' must not contain '.'}}
    fsdp.module "m\1B\0A.x" {
    }
  }
}
// CHECK: error: 'fsdp.module' op module name 'm\x1b\n.x' must not contain '.' (FQNs are joined with '.'){{$}}

// -----

fsdp.model @model {
  // expected-error@+1 {{duplicate mesh axis name 'd\x07\n\xfe'}}
  fsdp.mesh @mesh ["d\07\0A\FE" = 2, "d\07\0A\FE" = 1]
  fsdp.module "" {
  }
}
// CHECK: error: 'fsdp.mesh' op duplicate mesh axis name 'd\x07\n\xfe'{{$}}

// -----

fsdp.model @model {
  // expected-error@+1 {{mesh axis 'a\r\nb' must have a positive size, got 0}}
  fsdp.mesh @mesh ["a\0D\0Ab" = 0]
  fsdp.module "" {
  }
}
// CHECK: error: 'fsdp.mesh' op mesh axis 'a\r\nb' must have a positive size, got 0{{$}}

// -----

fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    fsdp.module "u\1B" {
      fsdp.param "w\07" : tensor<4xf32> frozen
      // expected-error@+2 {{duplicate name 'w\x07' in module "u\x1b"}}
      // expected-note@-2 {{first defined here}}
      fsdp.param "w\07" : tensor<4xf32> frozen
    }
  }
}
// CHECK: error: 'fsdp.param' op duplicate name 'w\x07' in module "u\x1b"{{$}}

// -----

fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" {
    // expected-error@+1 {{is tied to unknown parameter 'x\x1b\ny\xc3'}}
    fsdp.param "w" : tensor<4xf32> frozen tied_to "x\1B\0Ay\C3"
  }
}
// CHECK: error: 'fsdp.param' op is tied to unknown parameter 'x\x1b\ny\xc3'{{$}}

// -----

fsdp.model @model {
  fsdp.mesh @"m\1B\0A" ["dp" = 2]
  // expected-error@+1 {{fully_shard has 2 placements but mesh @m\x1b\n has 1 axes}}
  fsdp.module "" fully_shard <[replicate, shard], main_params = f32> {
  }
}
// CHECK: error: 'fsdp.module' op fully_shard has 2 placements but mesh @m\x1b\n has 1 axes{{$}}

// -----

fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  // expected-error@+1 {{names unit "\x9b\x1b[31m", which is not a fully_shard module}}
  fsdp.param_group @group0 unit "\9B\1B[31m" : f32 policy <[shard], main_params = f32> {
    fsdp.member ["w"] : tensor<4xf32>
  }
}
// CHECK: error: 'fsdp.param_group' op names unit "\x9b\x1b[31m", which is not a fully_shard module{{$}}

// -----

fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4xf32>
  }
  fsdp.param_group @group0 unit "" : f32 policy <[shard], main_params = f32> {
    // expected-error@+1 {{names unknown parameter 'v\x00\x7f\n'}}
    fsdp.member ["v\00\7F\0A"] : tensor<4xf32>
  }
}
// CHECK: error: 'fsdp.member' op names unknown parameter 'v\x00\x7f\n'{{$}}
