// Option values that would make code that does not compile are refused, in
// one line naming the option and the value, before anything is written.
// RUN: fsdp-opt --fsdp-lower-fully-shard %s -o %t.mlir
// RUN: rm -f %t.plans.bin

// Keywords of C or C++, as the prefix, the namespace or the namespace the
// prefix gives by default.
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-symbol-prefix=for 2>&1 | FileCheck %s --check-prefix=PREFIX-KEYWORD
// PREFIX-KEYWORD: error: --cpp-symbol-prefix must not be a C or C++ keyword, got 'for'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-symbol-prefix=restrict 2>&1 | FileCheck %s --check-prefix=PREFIX-C-KEYWORD
// PREFIX-C-KEYWORD: error: --cpp-symbol-prefix must not be a C or C++ keyword, got 'restrict'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-namespace=class 2>&1 | FileCheck %s --check-prefix=NS-KEYWORD
// NS-KEYWORD: error: --cpp-namespace must not hold 'class', a C or C++ keyword, got 'class'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-namespace=a::int 2>&1 | FileCheck %s --check-prefix=NS-INNER-KEYWORD
// NS-INNER-KEYWORD: error: --cpp-namespace must not hold 'int', a C or C++ keyword, got 'a::int'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-namespace=a::and_eq 2>&1 | FileCheck %s --check-prefix=NS-ALT-TOKEN
// NS-ALT-TOKEN: error: --cpp-namespace must not hold 'and_eq', a C or C++ keyword, got 'a::and_eq'{{$}}

// Identifiers reserved to the compiler (its macros would replace them),
// the capitals of the macros included.
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-symbol-prefix=__linux__ 2>&1 | FileCheck %s --check-prefix=PREFIX-RESERVED
// PREFIX-RESERVED: error: --cpp-symbol-prefix must not be an identifier reserved to the compiler and the standard library (names holding '__' or starting with '_' and a capital letter), got '__linux__'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-symbol-prefix=_gnu 2>&1 | FileCheck %s --check-prefix=PREFIX-RESERVED-MACRO
// PREFIX-RESERVED-MACRO: error: --cpp-symbol-prefix must not be an identifier reserved to the compiler and the standard library (names holding '__' or starting with '_' and a capital letter), got '_gnu'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-namespace=a::_X 2>&1 | FileCheck %s --check-prefix=NS-RESERVED
// NS-RESERVED: error: --cpp-namespace must not hold '_X', an identifier reserved to the compiler and the standard library (names holding '__' or starting with '_' and a capital letter), got 'a::_X'{{$}}

// The runtime's C API and names the generated code uses itself.
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-symbol-prefix=fsdp --cpp-namespace=ok 2>&1 | FileCheck %s --check-prefix=PREFIX-RUNTIME
// PREFIX-RUNTIME: error: --cpp-symbol-prefix must not be 'fsdp' (it would define fsdp_open, a function of the runtime's C API), got 'fsdp'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-symbol-prefix=std 2>&1 | FileCheck %s --check-prefix=NS-DEFAULT
// NS-DEFAULT: error: --cpp-namespace (by default the --cpp-symbol-prefix) must not hold 'std', which the generated code uses unqualified, got 'std'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-namespace=a::fsdp 2>&1 | FileCheck %s --check-prefix=NS-FSDP
// NS-FSDP: error: --cpp-namespace must not hold 'fsdp', which the generated code uses unqualified, got 'a::fsdp'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-namespace=a::int64_t 2>&1 | FileCheck %s --check-prefix=NS-TYPE
// NS-TYPE: error: --cpp-namespace must not hold 'int64_t', which the generated code uses unqualified, got 'a::int64_t'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-symbol-prefix=wx --cpp-namespace=wx_open::api 2>&1 | FileCheck %s --check-prefix=NS-GLOBAL
// NS-GLOBAL: error: --cpp-namespace must not start with 'wx_open', which the source defines at global scope, got 'wx_open::api'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-namespace=report 2>&1 | FileCheck %s --check-prefix=NS-HELPER
// NS-HELPER: error: --cpp-namespace must not start with 'report', which the source defines at global scope, got 'report'{{$}}

// Not identifiers at all; the value is printed with its control bytes
// escaped.
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-symbol-prefix=é 2>&1 | FileCheck %s --check-prefix=PREFIX-ASCII
// PREFIX-ASCII: error: --cpp-symbol-prefix must be a C identifier, got 'é'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --cpp-namespace=a:::b 2>&1 | FileCheck %s --check-prefix=NS-SYNTAX
// NS-SYNTAX: error: --cpp-namespace must be a C++ namespace (identifiers joined by '::'), got 'a:::b'{{$}}

// The source includes the header by its file name, which an #include
// cannot escape: quotes, backslashes and trigraphs are refused.
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --emit-cpp-header='%t.dir/b\h.h' 2>&1 | FileCheck %s --check-prefix=HEADER-BACKSLASH
// HEADER-BACKSLASH: error: --emit-cpp-header: the source includes the header by its file name, which must not hold quotes or backslashes (an #include cannot escape them), got '{{.*}}.dir/b\h.h'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --emit-cpp-header='%t.dir/q"h.h' 2>&1 | FileCheck %s --check-prefix=HEADER-QUOTE
// HEADER-QUOTE: error: --emit-cpp-header: the source includes the header by its file name, which must not hold quotes or backslashes (an #include cannot escape them), got '{{.*}}.dir/q"h.h'{{$}}
// RUN: not fsdp-translate --emit-cpp %t.mlir -o %t.cpp --emit-cpp-header='%t.dir/h??=.h' 2>&1 | FileCheck %s --check-prefix=HEADER-TRIGRAPH
// HEADER-TRIGRAPH: error: --emit-cpp-header: the source includes the header by its file name, which must not hold '??' (a trigraph in C; a warning in C++), got '{{.*}}.dir/h??=.h'{{$}}
// Refused before anything is written: no plan file beside the output.
// RUN: not ls %t.plans.bin

fsdp.model @model {
  fsdp.mesh @mesh ["dp" = 2]
  fsdp.module "" fully_shard <[shard], main_params = f32> {
    fsdp.param "w" : tensor<4x3xbf16>
  }
}
