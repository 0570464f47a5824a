//===- Pickle.h - Restricted pickle reader and protocol-2 writer -*- C++ -*-===//
//
// PyTorch checkpoints are pickles: DCP's `.metadata` (protocol 4, or 5 on
// Python 3.14) and each item's `data.pkl` (protocol 2). Loading one must never
// run code, so the reader is a plain stack machine that builds a value tree:
// a global is recorded as its (module, name) and checked against an
// allow-list, a REDUCE/NEWOBJ/BUILD becomes an Object node, nothing is ever
// called. Conversions to typed structs live with their formats
// (DcpMetadata.h, Zip.h).
//
// Bounds: the reader never recurses; every node is created by one opcode, so
// nodes, memo entries and string bytes are all bounded by the input size
// (None, booleans, the empty tuple and ints 0..255 are shared nodes, as in
// CPython).
// Walking a tree recursively (toPythonRepr, the writer's writeValue) is
// depth-limited, since memo references can build cycles and deep chains.
//
// Plain C++17, never throws: fallible calls return fsdp::Result/Status.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_PICKLE_H
#define FSDP_FORMAT_PICKLE_H

#include "fsdp/Support/Result.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fsdp {
namespace pickle {

enum class Kind : uint8_t {
  None,
  Bool,
  Int,    // fits in int64_t
  BigInt, // any other integer: `text` holds its little-endian two's complement
  Float,
  String, // UTF-8 in `text`
  Bytes,  // raw bytes in `text`
  Tuple,
  List,
  Dict,
  Global,       // `text` = module, `name` = attribute; never resolved
  Object,       // the result of REDUCE or NEWOBJ (and BUILD) on a global
  PersistentId, // BINPERSID: `args` is the persistent id value
};

/// How an Object node was made: `callable(*args)` (REDUCE) or
/// `cls.__new__(cls, *args)` (NEWOBJ).
enum class Origin : uint8_t { Reduce, NewObj };

/// One node of a value tree. Nodes are owned by a Document and refer to each
/// other by pointer, so a memo reference shares the node as Python would.
struct Value {
  Kind kind = Kind::None;
  Origin origin = Origin::Reduce;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;
  std::string name;
  /// Tuple and List elements; for an Object, items appended by APPEND(S).
  std::vector<Value *> items;
  /// Dict entries in insertion order (keys may repeat if the pickle repeats
  /// them); for an Object, items set by SETITEM(S).
  std::vector<std::pair<Value *, Value *>> entries;
  /// Object: the Global called, its argument Tuple and the BUILD state (null
  /// when there was no BUILD). PersistentId: `args` is the id.
  Value *callable = nullptr;
  Value *args = nullptr;
  Value *state = nullptr;

  bool isGlobal(std::string_view module, std::string_view attr) const {
    return kind == Kind::Global && text == module && name == attr;
  }
  /// An Object made from the global `module.attr`.
  bool isObjectOf(std::string_view module, std::string_view attr) const {
    return kind == Kind::Object && callable && callable->isGlobal(module, attr);
  }
  /// The value of string key `key` in a Dict (the last one if repeated), or
  /// null.
  const Value *find(std::string_view key) const;
};

/// Short name of a kind for error messages ("tuple", "dict", ...).
const char *kindName(Kind kind);

/// Owns the nodes of one value tree.
class Document {
public:
  Document() : arena_(std::make_unique<Arena>()) {}

  /// A new node of `kind`, owned by this document.
  Value *make(Kind kind);
  Value *makeInt(int64_t value);
  Value *makeString(std::string text);
  Value *makeGlobal(std::string module, std::string name);
  Value *makeTuple(std::vector<Value *> items);

  const Value *root() const { return root_; }
  void setRoot(Value *root) { root_ = root; }
  /// The offset just past the STOP opcode: where the pickle ends (a reader
  /// decides what bytes after it mean).
  size_t end() const { return end_; }
  void setEnd(size_t end) { end_ = end; }
  size_t nodeCount() const { return arena_->count; }

private:
  // Blocks of nodes growing from 16 to 4096, so a small pickle stays small
  // and a large one costs one allocation per 4096 nodes. Behind a pointer
  // so moving a Document keeps node addresses.
  struct Arena {
    std::vector<std::unique_ptr<Value[]>> blocks;
    size_t blockSize = 0, used = 0, count = 0;
  };
  std::unique_ptr<Arena> arena_;
  Value *root_ = nullptr;
  size_t end_ = 0;
};

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

/// Decides whether a GLOBAL / STACK_GLOBAL may appear.
using GlobalFilter = bool (*)(std::string_view module, std::string_view name);

/// The allow-list for DCP checkpoints: the DCP metadata classes (and the old
/// sharded_tensor TensorProperties), torch.Size, torch dtypes and layouts,
/// memory formats, legacy typed storages and UntypedStorage,
/// torch.serialization._get_layout, torch._utils._rebuild_tensor{,_v2,_v3},
/// torch._utils._rebuild_parameter, collections.OrderedDict, and pathlib
/// paths (pathlib and pathlib._local).
bool isDcpGlobal(std::string_view module, std::string_view name);

struct ReadOptions {
  GlobalFilter allowGlobal = isDcpGlobal;
};

/// Parses a pickle of protocol 0-5 restricted to the binary opcodes DCP
/// needs: PROTO FRAME STOP MARK POP POP_MARK DUP MEMOIZE (LONG_)BINPUT
/// (LONG_)BINGET GLOBAL STACK_GLOBAL SHORT_BINUNICODE BINUNICODE BINUNICODE8
/// SHORT_BINBYTES BINBYTES BINBYTES8 NONE NEWTRUE NEWFALSE BININT1 BININT2
/// BININT LONG1 LONG4 BINFLOAT EMPTY_TUPLE TUPLE1-3 TUPLE EMPTY_LIST LIST
/// APPEND APPENDS EMPTY_DICT DICT SETITEM SETITEMS REDUCE NEWOBJ NEWOBJ_EX
/// BUILD BINPERSID. Errors name the byte offset: truncated input, unknown
/// opcode, stack underflow, missing MARK, unknown memo key, a global the
/// filter refuses, invalid UTF-8, a STOP that leaves more than one value.
Result<Document> read(std::string_view bytes, const ReadOptions &options = {});

/// Python's repr() of a value for None, bool, int (BigInt too), float, str,
/// bytes, tuple, list and dict, e.g. "(0.9, 0.999)" or "['a', 'b']"; globals
/// print as module.name, objects as module.name(args). Fails past `maxDepth`
/// nested containers (memo references can make cycles) or past `maxChars`
/// characters (memo references can make a small pickle expand without bound).
Result<std::string> toPythonRepr(const Value &value, unsigned maxDepth = 64,
                                 size_t maxChars = size_t(1) << 20);

//===----------------------------------------------------------------------===//
// Writing (protocol 2)
//===----------------------------------------------------------------------===//

/// Emits a protocol-2 pickle opcode by opcode, so large objects (a DCP
/// `.metadata` for thousands of ranks) stream out without building a tree.
/// Method names follow the opcodes; a caller builds each value bottom-up as
/// the unpickler's stack machine will see it.
///
/// Globals are always memoized and repeated ones are emitted as BINGET. With
/// `memoizeAll`, every string, global, non-empty tuple, list, dict and
/// reduced object is also memoized (BINPUT) right where CPython's pickler
/// does it, which makes `torch.save`'s data.pkl byte for byte reproducible;
/// without it only sharedString() strings are (less work for the reader).
class Writer {
public:
  struct Options {
    bool memoizeAll = false;
    /// Protocol 2 numbers memo entries with 32 bits (LONG_BINPUT), so at most
    /// 2^32 values can be memoized; past that the writer fails, naming the
    /// limit. Lower only to test that check.
    uint64_t memoLimit = uint64_t(1) << 32;
  };
  Writer() : Writer(Options{}) {}
  explicit Writer(Options options);

  void none();
  void boolean(bool value);
  /// BININT1 / BININT2 / BININT / LONG1, as CPython chooses.
  void integer(int64_t value);
  /// LONG1 of raw little-endian two's complement bytes (a BigInt's text).
  void bigInteger(std::string_view twosComplement);
  void real(double value);
  /// BINUNICODE; the text must be valid UTF-8 (checked; reported by finish).
  void string(std::string_view text);
  /// A string written once and repeated as BINGET, as CPython shares
  /// interned names: for field names, keys and paths that recur.
  void sharedString(std::string_view text);
  /// SHORT_BINBYTES / BINBYTES (protocol-3 opcodes; every Python 3 reads them).
  void bytes(std::string_view data);
  void global(std::string_view module, std::string_view name);

  /// Where a shared string or a global went in the memo, so one written
  /// millions of times (a field name of every chunk) repeats as BINGET with
  /// no lookup. A slot belongs to one writer and one text.
  struct MemoSlot {
    uint32_t index = 0;
    bool set = false;
  };
  void sharedString(std::string_view text, MemoSlot &slot);
  void global(std::string_view module, std::string_view name, MemoSlot &slot);

  void mark();
  void emptyTuple();
  /// Pops the top `count` values (1..3) into a tuple (TUPLE1..TUPLE3).
  void tupleOf(unsigned count);
  /// Pops everything since the last mark() into a tuple (TUPLE).
  void tupleFromMark();
  /// A tuple of ints as CPython writes one (EMPTY_TUPLE, TUPLE1-3, or
  /// MARK ... TUPLE).
  void intTuple(const std::vector<int64_t> &values);
  void emptyList();
  /// Appends everything since the last mark() to the list below the mark.
  void appends();
  void append();
  void emptyDict();
  /// Sets key/value pairs since the last mark() in the dict below the mark.
  void setItems();
  void setItem();
  /// callable args -> callable(*args)
  void reduce();
  /// cls args -> cls.__new__(cls, *args)
  void newObj();
  /// object state -> object with state
  void build();
  /// pid -> persistent_load(pid)
  void persistentId();

  /// Writes a whole value tree, batching list and dict items by 1000 as
  /// CPython does. Fails past `maxDepth` nesting (cycles included) or on
  /// nodes that protocol 2 cannot express (PersistentId is written as
  /// BINPERSID).
  Status writeValue(const Value &value, unsigned maxDepth = 64);

  /// Appends STOP and returns the pickle, or the first error recorded. After
  /// clearPending(), only what was written since.
  Result<std::string> finish();

  /// Streaming: the bytes written since the last clearPending(), which a
  /// caller hands on before clearing them, so a large pickle is never held
  /// whole. The memo stays, so later values may refer to earlier ones.
  std::string_view pending() const { return out_; }
  void clearPending() { out_.clear(); }
  /// The first error recorded (invalid UTF-8, a format limit), if any.
  Status status() const;

private:
  void op(uint8_t code) { out_.push_back(static_cast<char>(code)); }
  void writeString(std::string_view text);
  void memoize();
  void binGet(uint32_t index);

  Options options_;
  std::string out_;
  std::string error_;
  uint64_t memoCount_ = 0;
  std::string lookupKey_; // reused, so memo lookups do not allocate
  std::unordered_map<std::string, uint32_t> globalMemo_;
  std::unordered_map<std::string, uint32_t> stringMemo_;
};

} // namespace pickle
} // namespace fsdp

#endif // FSDP_FORMAT_PICKLE_H
