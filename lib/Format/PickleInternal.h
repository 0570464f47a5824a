//===- PickleInternal.h - Pickle opcodes and the UTF-8 check ----*- C++ -*-===//
//
// The opcode bytes and the UTF-8 check the restricted reader
// (PickleReader.cpp) and the protocol-2 writer (PickleWriter.cpp) share.
// Private to lib/Format.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_LIB_FORMAT_PICKLEINTERNAL_H
#define FSDP_LIB_FORMAT_PICKLEINTERNAL_H

#include <cstdint>
#include <string_view>

namespace fsdp {
namespace pickle {
namespace detail {

/// UTF-8 as CPython's "surrogatepass" decoder accepts it (encoded surrogates
/// allowed, overlong forms and values past U+10FFFF refused). In
/// PickleReader.cpp.
bool isValidUtf8(std::string_view s);

namespace opcodes {

// Opcodes (CPython Lib/pickle.py).
enum : uint8_t {
  MARK = '(',
  STOP = '.',
  POP = '0',
  POP_MARK = '1',
  DUP = '2',
  BINFLOAT = 'G',
  BININT = 'J',
  BININT1 = 'K',
  BININT2 = 'M',
  NONE = 'N',
  BINPERSID = 'Q',
  REDUCE = 'R',
  BINUNICODE = 'X',
  APPEND = 'a',
  BUILD = 'b',
  GLOBAL = 'c',
  DICT = 'd',
  EMPTY_DICT = '}',
  APPENDS = 'e',
  BINGET = 'h',
  LONG_BINGET = 'j',
  LIST = 'l',
  EMPTY_LIST = ']',
  BINPUT = 'q',
  LONG_BINPUT = 'r',
  SETITEM = 's',
  TUPLE = 't',
  EMPTY_TUPLE = ')',
  SETITEMS = 'u',
  BINBYTES = 'B',
  SHORT_BINBYTES = 'C',
  PROTO = 0x80,
  NEWOBJ = 0x81,
  TUPLE1 = 0x85,
  TUPLE2 = 0x86,
  TUPLE3 = 0x87,
  NEWTRUE = 0x88,
  NEWFALSE = 0x89,
  LONG1 = 0x8a,
  LONG4 = 0x8b,
  SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e,
  NEWOBJ_EX = 0x92,
  STACK_GLOBAL = 0x93,
  MEMOIZE = 0x94,
  FRAME = 0x95,
};

} // namespace opcodes
} // namespace detail
} // namespace pickle
} // namespace fsdp

#endif // FSDP_LIB_FORMAT_PICKLEINTERNAL_H
