//===- PickleReader.cpp - The restricted pickle reader --------------------===//
//
// A stack machine over the opcodes DCP needs (Pickle.h): globals are checked
// against ReadOptions::allowGlobal and recorded, never imported; REDUCE,
// NEWOBJ and BUILD make Object nodes, nothing is called.
//
//===----------------------------------------------------------------------===//

#include "PickleInternal.h"
#include "fsdp/Format/Pickle.h"

#include <algorithm>
#include <cstring>

namespace fsdp {
namespace pickle {

using namespace detail::opcodes;
using detail::isValidUtf8;

namespace {

/// Names of real pickle opcodes this reader refuses, for a clearer error.
const char *unsupportedOpcodeName(uint8_t code) {
  switch (code) {
  case 'F':
    return "FLOAT";
  case 'I':
    return "INT";
  case 'L':
    return "LONG";
  case 'P':
    return "PERSID";
  case 'S':
    return "STRING";
  case 'T':
    return "BINSTRING";
  case 'U':
    return "SHORT_BINSTRING";
  case 'V':
    return "UNICODE";
  case 'g':
    return "GET";
  case 'i':
    return "INST";
  case 'o':
    return "OBJ";
  case 'p':
    return "PUT";
  case 0x82:
    return "EXT1";
  case 0x83:
    return "EXT2";
  case 0x84:
    return "EXT4";
  case 0x8f:
    return "EMPTY_SET";
  case 0x90:
    return "ADDITEMS";
  case 0x91:
    return "FROZENSET";
  case 0x96:
    return "BYTEARRAY8";
  case 0x97:
    return "NEXT_BUFFER";
  case 0x98:
    return "READONLY_BUFFER";
  default:
    return nullptr;
  }
}

uint64_t readLittle(const char *p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;)
    v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

/// The stack machine. Each opcode handler either succeeds or sets `error_`.
class Reader {
public:
  Reader(std::string_view in, const ReadOptions &options) : in_(in), options_(options) {}

  Result<Document> run();

private:
  Error fail(const std::string &message) const {
    return makeError("pickle: " + message + " at offset " + std::to_string(opStart_),
                     ErrorKind::Corrupt);
  }
  bool take(size_t n, const char *&p) {
    if (n > in_.size() - pos_)
      return false;
    p = in_.data() + pos_;
    pos_ += n;
    return true;
  }
  /// Values pushed since the last MARK.
  size_t available() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }
  Value *pop() {
    Value *v = stack_.back();
    stack_.pop_back();
    return v;
  }
  /// Ends the innermost MARK and returns the values pushed since it.
  std::vector<Value *> popMark() {
    size_t start = marks_.back();
    marks_.pop_back();
    std::vector<Value *> items(stack_.begin() + start, stack_.end());
    stack_.resize(start);
    return items;
  }

  std::string_view in_;
  const ReadOptions &options_;
  size_t pos_ = 0;
  size_t opStart_ = 0;
  Document doc_;
  std::vector<Value *> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, Value *> memo_;
  // Immutable values CPython shares too; one node each.
  Value *none_ = nullptr, *true_ = nullptr, *false_ = nullptr, *emptyTuple_ = nullptr;
  Value *smallInts_[256] = {};
};

Result<Document> Reader::run() {
  const char *p = nullptr;
  auto truncated = [&](const char *what) {
    return fail(std::string("truncated input in ") + what);
  };
  auto underflow = [&](const char *what) {
    return fail(std::string("stack underflow in ") + what);
  };
  auto noMark = [&](const char *what) { return fail(std::string("no MARK for ") + what); };
  auto pushString = [&](Kind kind, const char *what, size_t lengthBytes) -> Status {
    if (!take(lengthBytes, p))
      return truncated(what);
    uint64_t length = readLittle(p, lengthBytes);
    if (length > in_.size() - pos_)
      return truncated(what);
    take(static_cast<size_t>(length), p);
    std::string_view s(p, static_cast<size_t>(length));
    if (kind == Kind::String && !isValidUtf8(s))
      return fail(std::string("invalid UTF-8 in ") + what);
    Value *v = doc_.make(kind);
    v->text.assign(s);
    stack_.push_back(v);
    return Status::success();
  };
  auto pushGlobal = [&](std::string module, std::string name) -> Status {
    if (!options_.allowGlobal || !options_.allowGlobal(module, name))
      return makeError("pickle: global '" + module + "." + name + "' is not allowed at offset " +
                           std::to_string(opStart_),
                       ErrorKind::Corrupt);
    stack_.push_back(doc_.makeGlobal(std::move(module), std::move(name)));
    return Status::success();
  };
  auto memoPut = [&](uint32_t key) -> Status {
    if (available() == 0)
      return underflow("memo put");
    memo_[key] = stack_.back();
    return Status::success();
  };
  auto memoGet = [&](uint32_t key) -> Status {
    auto it = memo_.find(key);
    if (it == memo_.end())
      return fail("memo key " + std::to_string(key) + " not found");
    stack_.push_back(it->second);
    return Status::success();
  };
  auto pushLong = [&](size_t n) {
    Value *v;
    // Fits in int64_t when the bytes past the 8th only repeat the sign.
    bool fits = n <= 8;
    if (!fits) {
      uint8_t sign = (static_cast<uint8_t>(p[7]) & 0x80) ? 0xFF : 0x00;
      fits = true;
      for (size_t i = 8; i < n && fits; ++i)
        fits = static_cast<uint8_t>(p[i]) == sign;
    }
    if (fits) {
      v = doc_.make(Kind::Int);
      size_t used = n < 8 ? n : 8;
      uint64_t raw = readLittle(p, used);
      if (used > 0 && used < 8 && (static_cast<uint8_t>(p[used - 1]) & 0x80))
        raw |= ~uint64_t(0) << (8 * used);
      v->integer = static_cast<int64_t>(raw);
    } else {
      v = doc_.make(Kind::BigInt);
      v->text.assign(p, n);
    }
    stack_.push_back(v);
  };
  auto makeTupleFrom = [&](std::vector<Value *> items) {
    stack_.push_back(doc_.makeTuple(std::move(items)));
  };
  // Appends to a list, or to an object's list items.
  auto extendList = [&](Value *target, const std::vector<Value *> &items,
                        const char *what) -> Status {
    if (target->kind != Kind::List && target->kind != Kind::Object)
      return fail(std::string(what) + " on a " + kindName(target->kind));
    target->items.insert(target->items.end(), items.begin(), items.end());
    return Status::success();
  };
  auto setItems = [&](Value *target, const std::vector<Value *> &items,
                      const char *what) -> Status {
    if (target->kind != Kind::Dict && target->kind != Kind::Object)
      return fail(std::string(what) + " on a " + kindName(target->kind));
    if (items.size() % 2 != 0)
      return fail(std::string(what) + " with an odd number of values");
    for (size_t i = 0; i < items.size(); i += 2)
      target->entries.emplace_back(items[i], items[i + 1]);
    return Status::success();
  };
  auto makeObject = [&](Value *callable, Value *args, Origin origin, const char *what) -> Status {
    if (callable->kind != Kind::Global)
      return fail(std::string(what) + " of a " + kindName(callable->kind) +
                  " (only globals may be called)");
    if (args->kind != Kind::Tuple)
      return fail(std::string(what) + " arguments are a " + kindName(args->kind) + ", not a tuple");
    Value *v = doc_.make(Kind::Object);
    v->origin = origin;
    v->callable = callable;
    v->args = args;
    stack_.push_back(v);
    return Status::success();
  };

  while (true) {
    opStart_ = pos_;
    if (!take(1, p))
      return fail("truncated input (no STOP)");
    auto code = static_cast<uint8_t>(*p);
    Status status;
    switch (code) {
    case PROTO:
      if (!take(1, p))
        return truncated("PROTO");
      if (static_cast<uint8_t>(*p) > 5)
        return fail("unsupported protocol " + std::to_string(static_cast<uint8_t>(*p)));
      break;
    case FRAME: { // A read-ahead hint; opcodes are checked one by one.
      if (!take(8, p))
        return truncated("FRAME");
      uint64_t length = 0;
      for (int i = 7; i >= 0; --i)
        length = (length << 8) | static_cast<uint8_t>(p[i]);
      // As CPython's unpickler: a frame never runs past the input.
      if (length > in_.size() - pos_)
        return fail("truncated input: a FRAME of " + std::to_string(length) +
                    " bytes runs past the end");
      break;
    }
    case STOP:
      if (!marks_.empty())
        return fail("STOP inside an open MARK");
      if (stack_.size() != 1)
        return fail("STOP with " + std::to_string(stack_.size()) +
                    " values on the stack (expected 1)");
      doc_.setRoot(stack_.back());
      doc_.setEnd(pos_);
      return std::move(doc_);
    case MARK:
      marks_.push_back(stack_.size());
      break;
    case POP:
      if (available() > 0)
        stack_.pop_back();
      else if (!marks_.empty())
        popMark();
      else
        return underflow("POP");
      break;
    case POP_MARK:
      if (marks_.empty())
        return noMark("POP_MARK");
      popMark();
      break;
    case DUP:
      if (available() == 0)
        return underflow("DUP");
      stack_.push_back(stack_.back());
      break;
    case MEMOIZE:
      status = memoPut(static_cast<uint32_t>(memo_.size()));
      break;
    case BINPUT:
      if (!take(1, p))
        return truncated("BINPUT");
      status = memoPut(static_cast<uint8_t>(*p));
      break;
    case LONG_BINPUT:
      if (!take(4, p))
        return truncated("LONG_BINPUT");
      status = memoPut(static_cast<uint32_t>(readLittle(p, 4)));
      break;
    case BINGET:
      if (!take(1, p))
        return truncated("BINGET");
      status = memoGet(static_cast<uint8_t>(*p));
      break;
    case LONG_BINGET:
      if (!take(4, p))
        return truncated("LONG_BINGET");
      status = memoGet(static_cast<uint32_t>(readLittle(p, 4)));
      break;
    case GLOBAL: {
      std::string parts[2];
      for (std::string &part : parts) {
        size_t end = in_.find('\n', pos_);
        if (end == std::string_view::npos)
          return truncated("GLOBAL");
        part.assign(in_.substr(pos_, end - pos_));
        pos_ = end + 1;
      }
      status = pushGlobal(std::move(parts[0]), std::move(parts[1]));
      break;
    }
    case STACK_GLOBAL: {
      if (available() < 2)
        return underflow("STACK_GLOBAL");
      Value *name = pop();
      Value *module = pop();
      if (name->kind != Kind::String || module->kind != Kind::String)
        return fail("STACK_GLOBAL needs two strings");
      status = pushGlobal(module->text, name->text);
      break;
    }
    case SHORT_BINUNICODE:
      status = pushString(Kind::String, "SHORT_BINUNICODE", 1);
      break;
    case BINUNICODE:
      status = pushString(Kind::String, "BINUNICODE", 4);
      break;
    case BINUNICODE8:
      status = pushString(Kind::String, "BINUNICODE8", 8);
      break;
    case SHORT_BINBYTES:
      status = pushString(Kind::Bytes, "SHORT_BINBYTES", 1);
      break;
    case BINBYTES:
      status = pushString(Kind::Bytes, "BINBYTES", 4);
      break;
    case BINBYTES8:
      status = pushString(Kind::Bytes, "BINBYTES8", 8);
      break;
    case NONE:
      if (!none_)
        none_ = doc_.make(Kind::None);
      stack_.push_back(none_);
      break;
    case NEWTRUE:
    case NEWFALSE: {
      Value *&shared = code == NEWTRUE ? true_ : false_;
      if (!shared) {
        shared = doc_.make(Kind::Bool);
        shared->boolean = code == NEWTRUE;
      }
      stack_.push_back(shared);
      break;
    }
    case BININT1: {
      if (!take(1, p))
        return truncated("BININT1");
      Value *&shared = smallInts_[static_cast<uint8_t>(*p)];
      if (!shared)
        shared = doc_.makeInt(static_cast<uint8_t>(*p));
      stack_.push_back(shared);
      break;
    }
    case BININT2:
      if (!take(2, p))
        return truncated("BININT2");
      stack_.push_back(doc_.makeInt(static_cast<int64_t>(readLittle(p, 2))));
      break;
    case BININT:
      if (!take(4, p))
        return truncated("BININT");
      stack_.push_back(doc_.makeInt(static_cast<int32_t>(static_cast<uint32_t>(readLittle(p, 4)))));
      break;
    case LONG1:
    case LONG4: {
      size_t lengthBytes = code == LONG1 ? 1 : 4;
      if (!take(lengthBytes, p))
        return truncated(code == LONG1 ? "LONG1" : "LONG4");
      uint64_t n = readLittle(p, lengthBytes);
      if (code == LONG4 && (n & 0x80000000u))
        return fail("LONG4 with a negative length");
      if (n > in_.size() - pos_ || !take(static_cast<size_t>(n), p))
        return truncated(code == LONG1 ? "LONG1" : "LONG4");
      pushLong(static_cast<size_t>(n));
      break;
    }
    case BINFLOAT: {
      if (!take(8, p))
        return truncated("BINFLOAT");
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) // big-endian
        bits = (bits << 8) | static_cast<uint8_t>(p[i]);
      Value *v = doc_.make(Kind::Float);
      std::memcpy(&v->real, &bits, sizeof bits);
      stack_.push_back(v);
      break;
    }
    case EMPTY_TUPLE:
      if (!emptyTuple_)
        emptyTuple_ = doc_.makeTuple({});
      stack_.push_back(emptyTuple_);
      break;
    case TUPLE1:
    case TUPLE2:
    case TUPLE3: {
      size_t n = code - TUPLE1 + 1;
      if (available() < n)
        return underflow("TUPLE1/2/3");
      std::vector<Value *> items(stack_.end() - n, stack_.end());
      stack_.resize(stack_.size() - n);
      makeTupleFrom(std::move(items));
      break;
    }
    case TUPLE:
      if (marks_.empty())
        return noMark("TUPLE");
      makeTupleFrom(popMark());
      break;
    case EMPTY_LIST:
      stack_.push_back(doc_.make(Kind::List));
      break;
    case LIST: {
      if (marks_.empty())
        return noMark("LIST");
      Value *v = doc_.make(Kind::List);
      v->items = popMark();
      stack_.push_back(v);
      break;
    }
    case APPEND: {
      if (available() < 2)
        return underflow("APPEND");
      Value *item = pop();
      status = extendList(stack_.back(), {item}, "APPEND");
      break;
    }
    case APPENDS: {
      if (marks_.empty())
        return noMark("APPENDS");
      std::vector<Value *> items = popMark();
      if (available() == 0)
        return underflow("APPENDS");
      status = extendList(stack_.back(), items, "APPENDS");
      break;
    }
    case EMPTY_DICT:
      stack_.push_back(doc_.make(Kind::Dict));
      break;
    case DICT: {
      if (marks_.empty())
        return noMark("DICT");
      Value *v = doc_.make(Kind::Dict);
      status = setItems(v, popMark(), "DICT");
      stack_.push_back(v);
      break;
    }
    case SETITEM: {
      if (available() < 3)
        return underflow("SETITEM");
      Value *value = pop();
      Value *key = pop();
      status = setItems(stack_.back(), {key, value}, "SETITEM");
      break;
    }
    case SETITEMS: {
      if (marks_.empty())
        return noMark("SETITEMS");
      std::vector<Value *> items = popMark();
      if (available() == 0)
        return underflow("SETITEMS");
      status = setItems(stack_.back(), items, "SETITEMS");
      break;
    }
    case REDUCE: {
      if (available() < 2)
        return underflow("REDUCE");
      Value *args = pop();
      Value *callable = pop();
      status = makeObject(callable, args, Origin::Reduce, "REDUCE");
      break;
    }
    case NEWOBJ: {
      if (available() < 2)
        return underflow("NEWOBJ");
      Value *args = pop();
      Value *cls = pop();
      status = makeObject(cls, args, Origin::NewObj, "NEWOBJ");
      break;
    }
    case NEWOBJ_EX: {
      if (available() < 3)
        return underflow("NEWOBJ_EX");
      Value *kwargs = pop();
      Value *args = pop();
      Value *cls = pop();
      if (kwargs->kind != Kind::Dict || !kwargs->entries.empty())
        return fail("NEWOBJ_EX with keyword arguments is not supported");
      status = makeObject(cls, args, Origin::NewObj, "NEWOBJ_EX");
      break;
    }
    case BUILD: {
      if (available() < 2)
        return underflow("BUILD");
      Value *state = pop();
      Value *target = stack_.back();
      if (target->kind != Kind::Object)
        return fail(std::string("BUILD on a ") + kindName(target->kind));
      if (target->state)
        return fail("BUILD on an object that already has a state");
      target->state = state;
      break;
    }
    case BINPERSID: {
      if (available() < 1)
        return underflow("BINPERSID");
      Value *v = doc_.make(Kind::PersistentId);
      v->args = pop();
      stack_.push_back(v);
      break;
    }
    default: {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", code);
      if (const char *name = unsupportedOpcodeName(code))
        return fail(std::string("unsupported opcode ") + name + " (" + hex + ")");
      return fail(std::string("unknown opcode ") + hex);
    }
    }
    if (!status)
      return status.failure();
  }
}

} // namespace

namespace detail {

/// UTF-8 as CPython's "surrogatepass" decoder accepts it (encoded surrogates
/// allowed, overlong forms and values past U+10FFFF refused).
bool isValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n >= s.size() - i) // continuation bytes missing
      return false;
    for (size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80)
        return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static const uint32_t minimum[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < minimum[n] || cp > 0x10FFFF)
      return false;
    i += n + 1;
  }
  return true;
}

} // namespace detail

Result<Document> read(std::string_view bytes, const ReadOptions &options) {
  return Reader(bytes, options).run();
}

} // namespace pickle
} // namespace fsdp
