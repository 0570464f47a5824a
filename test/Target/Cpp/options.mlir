// Option errors, each naming the option.
// RUN: not fsdp-translate --emit-cpp %s --cpp-symbol-prefix=2fast -o %t.cpp 2>&1 | FileCheck %s --check-prefix=PREFIX
// PREFIX: error: --cpp-symbol-prefix must be a C identifier, got '2fast'
// RUN: not fsdp-translate --emit-cpp %s --cpp-namespace=a::-b -o %t.cpp 2>&1 | FileCheck %s --check-prefix=NS
// NS: error: --cpp-namespace must be a C++ namespace (identifiers joined by '::'), got 'a::-b'
// The plan bytes need a file: -o or --cpp-plan-file.
// RUN: fsdp-opt --fsdp-lower-fully-shard %s -o %t.lowered.mlir
// RUN: not fsdp-translate --emit-cpp %t.lowered.mlir 2>&1 | FileCheck %s --check-prefix=STDOUT
// STDOUT: error: --emit-cpp writes the plan bytes to a file beside the output: give -o FILE or --cpp-plan-file=FILE
// RUN: fsdp-translate --emit-cpp %t.lowered.mlir --cpp-plan-file=%t.bin | FileCheck %s --check-prefix=GIVEN
// GIVEN: asm(".pushsection .lrodata.fsdp_model_plan,"
// GIVEN: ".incbin \"{{.*}}options.mlir.tmp.bin\"\n"
// RUN: not fsdp-translate --emit-cpp %t.lowered.mlir --cpp-plan-file=%t.missing/dir/x.bin -o %t.cpp 2>&1 | FileCheck %s --check-prefix=UNWRITABLE
// UNWRITABLE: error: {{.*}}x.bin

fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4x3xbf16>
  }
}
