//===- Pickle.cpp - Restricted pickle reader and protocol-2 writer --------===//

#include "fsdp/Format/Pickle.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace fsdp {
namespace pickle {

namespace {

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

//===----------------------------------------------------------------------===//
// repr
//===----------------------------------------------------------------------===//

/// CPython's repr(float): shortest round-trip digits, exponent form when the
/// decimal point falls outside (-4, 16].
std::string pythonFloat(double v) {
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.')
      digits += c;
  while (digits.size() > 1 && digits.back() == '0')
    digits.pop_back();
  int decpt = exponent + 1;
  int n = static_cast<int>(digits.size());
  std::string out;
  if (decpt <= -4 || decpt > 16) {
    out = digits.substr(0, 1);
    if (n > 1)
      out += "." + digits.substr(1);
    char expbuf[16];
    std::snprintf(expbuf, sizeof expbuf, "e%c%02d", exponent < 0 ? '-' : '+',
                  exponent < 0 ? -exponent : exponent);
    out += expbuf;
  } else if (decpt <= 0) {
    out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  } else if (decpt >= n) {
    out = digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
  } else {
    out = digits.substr(0, static_cast<size_t>(decpt)) + "." +
          digits.substr(static_cast<size_t>(decpt));
  }
  return sign + out;
}

std::string quoted(std::string_view s, bool isBytes) {
  bool hasSingle = s.find('\'') != std::string_view::npos;
  bool hasDouble = s.find('"') != std::string_view::npos;
  char quote = hasSingle && !hasDouble ? '"' : '\'';
  std::string out = isBytes ? "b" : "";
  out += quote;
  for (char ch : s) {
    auto c = static_cast<uint8_t>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (isBytes && c >= 0x80)) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += ch;
    }
  }
  out += quote;
  return out;
}

/// Decimal text of a little-endian two's complement integer.
std::string bigIntDecimal(std::string_view bytes) {
  std::vector<uint8_t> mag(bytes.begin(), bytes.end());
  bool negative = !mag.empty() && (mag.back() & 0x80);
  if (negative) { // magnitude = ~x + 1
    unsigned carry = 1;
    for (uint8_t &b : mag) {
      unsigned v = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
  }
  std::string digits;
  while (true) {
    while (!mag.empty() && mag.back() == 0)
      mag.pop_back();
    if (mag.empty())
      break;
    unsigned rem = 0;
    for (size_t i = mag.size(); i-- > 0;) {
      unsigned cur = (rem << 8) | mag[i];
      mag[i] = static_cast<uint8_t>(cur / 10);
      rem = cur % 10;
    }
    digits += static_cast<char>('0' + rem);
  }
  if (digits.empty())
    digits = "0";
  if (negative)
    digits += '-';
  return std::string(digits.rbegin(), digits.rend());
}

Status appendRepr(const Value &v, unsigned depth, size_t maxChars, std::string &out) {
  if (depth == 0)
    return makeError("pickle: value nested too deeply (or cyclic) to print", ErrorKind::Corrupt);
  // Memo references let a small pickle name an exponentially large value.
  if (out.size() > maxChars)
    return makeError("pickle: value longer than " + std::to_string(maxChars) +
                         " characters to print (memo references expand it)",
                     ErrorKind::Corrupt);
  auto each = [&](const std::vector<Value *> &items) -> Status {
    for (size_t i = 0; i < items.size(); ++i) {
      if (i)
        out += ", ";
      if (Status s = appendRepr(*items[i], depth - 1, maxChars, out); !s)
        return s;
    }
    return Status::success();
  };
  switch (v.kind) {
  case Kind::None:
    out += "None";
    break;
  case Kind::Bool:
    out += v.boolean ? "True" : "False";
    break;
  case Kind::Int:
    out += std::to_string(v.integer);
    break;
  case Kind::BigInt:
    out += bigIntDecimal(v.text);
    break;
  case Kind::Float:
    out += pythonFloat(v.real);
    break;
  case Kind::String:
    out += quoted(v.text, false);
    break;
  case Kind::Bytes:
    out += quoted(v.text, true);
    break;
  case Kind::Global:
    out += v.text + "." + v.name;
    break;
  case Kind::Tuple:
    out += '(';
    if (Status s = each(v.items); !s)
      return s;
    out += v.items.size() == 1 ? ",)" : ")";
    break;
  case Kind::List:
    out += '[';
    if (Status s = each(v.items); !s)
      return s;
    out += ']';
    break;
  case Kind::Dict:
    out += '{';
    for (size_t i = 0; i < v.entries.size(); ++i) {
      if (i)
        out += ", ";
      if (Status s = appendRepr(*v.entries[i].first, depth - 1, maxChars, out); !s)
        return s;
      out += ": ";
      if (Status s = appendRepr(*v.entries[i].second, depth - 1, maxChars, out); !s)
        return s;
    }
    out += '}';
    break;
  case Kind::Object:
    if (!v.callable || !v.args)
      return makeError("pickle: object without a callable and arguments");
    out += v.callable->text + "." + v.callable->name + "(";
    if (Status s = each(v.args->items); !s)
      return s;
    out += ')';
    break;
  case Kind::PersistentId:
    if (!v.args)
      return makeError("pickle: persistent id without a value");
    out += "persistent_id(";
    if (Status s = appendRepr(*v.args, depth - 1, maxChars, out); !s)
      return s;
    out += ')';
    break;
  }
  return Status::success();
}

} // namespace

//===----------------------------------------------------------------------===//
// Value, Document
//===----------------------------------------------------------------------===//

const Value *Value::find(std::string_view key) const {
  for (size_t i = entries.size(); i-- > 0;)
    if (entries[i].first->kind == Kind::String && entries[i].first->text == key)
      return entries[i].second;
  return nullptr;
}

const char *kindName(Kind kind) {
  switch (kind) {
  case Kind::None:
    return "None";
  case Kind::Bool:
    return "bool";
  case Kind::Int:
    return "int";
  case Kind::BigInt:
    return "big int";
  case Kind::Float:
    return "float";
  case Kind::String:
    return "str";
  case Kind::Bytes:
    return "bytes";
  case Kind::Tuple:
    return "tuple";
  case Kind::List:
    return "list";
  case Kind::Dict:
    return "dict";
  case Kind::Global:
    return "global";
  case Kind::Object:
    return "object";
  case Kind::PersistentId:
    return "persistent id";
  }
  return "value";
}

Value *Document::make(Kind kind) {
  Arena &a = *arena_;
  if (a.used == a.blockSize) {
    a.blockSize = a.blockSize == 0 ? 16 : std::min<size_t>(a.blockSize * 2, 4096);
    a.blocks.push_back(std::make_unique<Value[]>(a.blockSize));
    a.used = 0;
  }
  Value *v = &a.blocks.back()[a.used++];
  ++a.count;
  v->kind = kind;
  return v;
}

Value *Document::makeInt(int64_t value) {
  Value *v = make(Kind::Int);
  v->integer = value;
  return v;
}

Value *Document::makeString(std::string text) {
  Value *v = make(Kind::String);
  v->text = std::move(text);
  return v;
}

Value *Document::makeGlobal(std::string module, std::string name) {
  Value *v = make(Kind::Global);
  v->text = std::move(module);
  v->name = std::move(name);
  return v;
}

Value *Document::makeTuple(std::vector<Value *> items) {
  Value *v = make(Kind::Tuple);
  v->items = std::move(items);
  return v;
}

//===----------------------------------------------------------------------===//
// Reading
//===----------------------------------------------------------------------===//

bool isDcpGlobal(std::string_view module, std::string_view name) {
  auto oneOf = [&](std::initializer_list<std::string_view> names) {
    for (std::string_view n : names)
      if (n == name)
        return true;
    return false;
  };
  if (module == "torch.distributed.checkpoint.metadata")
    return oneOf({"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                  "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
                  "MetadataIndex", "StorageMeta"});
  if (module == "torch.distributed._shard.sharded_tensor.metadata")
    return oneOf({"TensorProperties", "MEM_FORMAT_ENCODING"});
  if (module == "torch.distributed.checkpoint.filesystem")
    return name == "_StorageInfo";
  if (module == "torch")
    return oneOf({// containers and layouts
                  "Size", "strided", "contiguous_format", "channels_last", "channels_last_3d",
                  "preserve_format",
                  // dtypes
                  "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                  "uint8", "bool", "complex32", "complex64", "complex128", "float8_e4m3fn",
                  "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "uint16",
                  "uint32", "uint64",
                  // storages
                  "UntypedStorage", "DoubleStorage", "FloatStorage", "HalfStorage",
                  "BFloat16Storage", "LongStorage", "IntStorage", "ShortStorage", "CharStorage",
                  "ByteStorage", "BoolStorage", "ComplexFloatStorage", "ComplexDoubleStorage"});
  if (module == "torch.serialization")
    return name == "_get_layout";
  if (module == "torch._utils")
    return oneOf(
        {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter"});
  if (module == "collections")
    return name == "OrderedDict";
  if (module == "pathlib" || module == "pathlib._local")
    return oneOf({"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"});
  return false;
}

Result<Document> read(std::string_view bytes, const ReadOptions &options) {
  return Reader(bytes, options).run();
}

Result<std::string> toPythonRepr(const Value &value, unsigned maxDepth, size_t maxChars) {
  std::string out;
  if (Status s = appendRepr(value, maxDepth, maxChars, out); !s)
    return s.failure();
  return out;
}

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

Writer::Writer(Options options) : options_(options) {
  op(PROTO);
  op(2);
}

void Writer::memoize() {
  if (memoCount_ >= options_.memoLimit) {
    if (error_.empty())
      error_ = "pickle writer: more than " + std::to_string(options_.memoLimit) +
               " memoized values; protocol 2 numbers memo entries with 32 bits "
               "(LONG_BINPUT)";
    return;
  }
  if (memoCount_ < 256) {
    op(BINPUT);
    op(static_cast<uint8_t>(memoCount_));
  } else {
    op(LONG_BINPUT);
    for (int i = 0; i < 4; ++i)
      op(static_cast<uint8_t>(memoCount_ >> (8 * i)));
  }
  ++memoCount_;
}

void Writer::binGet(uint32_t index) {
  if (index < 256) {
    op(BINGET);
    op(static_cast<uint8_t>(index));
  } else {
    op(LONG_BINGET);
    for (int i = 0; i < 4; ++i)
      op(static_cast<uint8_t>(index >> (8 * i)));
  }
}

void Writer::none() { op(NONE); }

void Writer::boolean(bool value) { op(value ? NEWTRUE : NEWFALSE); }

void Writer::integer(int64_t value) {
  if (value >= 0 && value <= 0xff) {
    op(BININT1);
    op(static_cast<uint8_t>(value));
  } else if (value >= 0 && value <= 0xffff) {
    op(BININT2);
    op(static_cast<uint8_t>(value));
    op(static_cast<uint8_t>(value >> 8));
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    op(BININT);
    auto u = static_cast<uint32_t>(static_cast<int32_t>(value));
    for (int i = 0; i < 4; ++i)
      op(static_cast<uint8_t>(u >> (8 * i)));
  } else {
    // Shortest two's complement, as pickle.encode_long.
    auto u = static_cast<uint64_t>(value);
    std::string raw;
    for (int i = 0; i < 8; ++i)
      raw.push_back(static_cast<char>(u >> (8 * i)));
    while (raw.size() > 1) {
      auto last = static_cast<uint8_t>(raw.back());
      auto prev = static_cast<uint8_t>(raw[raw.size() - 2]);
      if ((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80)))
        raw.pop_back();
      else
        break;
    }
    bigInteger(raw);
  }
}

void Writer::bigInteger(std::string_view twosComplement) {
  if (twosComplement.size() > 255) {
    op(LONG4);
    auto n = static_cast<uint32_t>(twosComplement.size());
    for (int i = 0; i < 4; ++i)
      op(static_cast<uint8_t>(n >> (8 * i)));
  } else {
    op(LONG1);
    op(static_cast<uint8_t>(twosComplement.size()));
  }
  out_.append(twosComplement);
}

void Writer::real(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  op(BINFLOAT);
  for (int i = 7; i >= 0; --i)
    op(static_cast<uint8_t>(bits >> (8 * i)));
}

void Writer::writeString(std::string_view text) {
  if (!isValidUtf8(text) && error_.empty())
    error_ = "pickle writer: string is not valid UTF-8";
  if (text.size() > UINT32_MAX && error_.empty())
    error_ = "pickle writer: string longer than 4 GiB";
  op(BINUNICODE);
  auto n = static_cast<uint32_t>(text.size());
  for (int i = 0; i < 4; ++i)
    op(static_cast<uint8_t>(n >> (8 * i)));
  out_.append(text);
}

void Writer::string(std::string_view text) {
  writeString(text);
  if (options_.memoizeAll)
    memoize();
}

void Writer::sharedString(std::string_view text) {
  lookupKey_.assign(text);
  auto it = stringMemo_.find(lookupKey_);
  if (it != stringMemo_.end()) {
    binGet(it->second);
    return;
  }
  writeString(text);
  stringMemo_.emplace(lookupKey_, static_cast<uint32_t>(memoCount_));
  memoize();
}

void Writer::sharedString(std::string_view text, MemoSlot &slot) {
  if (slot.set)
    return binGet(slot.index);
  sharedString(text);
  // lookupKey_ still holds the text.
  slot = {stringMemo_.find(lookupKey_)->second, true};
}

void Writer::global(std::string_view module, std::string_view name, MemoSlot &slot) {
  if (slot.set)
    return binGet(slot.index);
  global(module, name);
  slot = {globalMemo_.find(lookupKey_)->second, true};
}

void Writer::bytes(std::string_view data) {
  if (data.size() > UINT32_MAX && error_.empty())
    error_ = "pickle writer: bytes longer than 4 GiB";
  if (data.size() < 256) {
    op(SHORT_BINBYTES);
    op(static_cast<uint8_t>(data.size()));
  } else {
    op(BINBYTES);
    auto n = static_cast<uint32_t>(data.size());
    for (int i = 0; i < 4; ++i)
      op(static_cast<uint8_t>(n >> (8 * i)));
  }
  out_.append(data);
  if (options_.memoizeAll)
    memoize();
}

void Writer::global(std::string_view module, std::string_view name) {
  std::string &key = lookupKey_;
  key.assign(module).append(1, '\n').append(name);
  auto it = globalMemo_.find(key);
  if (it != globalMemo_.end()) {
    binGet(it->second);
    return;
  }
  if ((module.find('\n') != std::string_view::npos || name.find('\n') != std::string_view::npos) &&
      error_.empty())
    error_ = "pickle writer: global name contains a newline";
  op(GLOBAL);
  out_.append(key).append(1, '\n');
  globalMemo_.emplace(key, static_cast<uint32_t>(memoCount_));
  memoize();
}

void Writer::mark() { op(MARK); }
void Writer::emptyTuple() { op(EMPTY_TUPLE); }

void Writer::tupleOf(unsigned count) {
  if ((count < 1 || count > 3) && error_.empty())
    error_ = "pickle writer: tupleOf takes 1 to 3 values";
  op(static_cast<uint8_t>(TUPLE1 + (count ? count - 1 : 0)));
  if (options_.memoizeAll)
    memoize();
}

void Writer::tupleFromMark() {
  op(TUPLE);
  if (options_.memoizeAll)
    memoize();
}

void Writer::intTuple(const std::vector<int64_t> &values) {
  if (values.empty()) {
    emptyTuple();
    return;
  }
  if (values.size() > 3)
    mark();
  for (int64_t v : values)
    integer(v);
  if (values.size() > 3)
    tupleFromMark();
  else
    tupleOf(static_cast<unsigned>(values.size()));
}

void Writer::emptyList() {
  op(EMPTY_LIST);
  if (options_.memoizeAll)
    memoize();
}

void Writer::appends() { op(APPENDS); }
void Writer::append() { op(APPEND); }

void Writer::emptyDict() {
  op(EMPTY_DICT);
  if (options_.memoizeAll)
    memoize();
}

void Writer::setItems() { op(SETITEMS); }
void Writer::setItem() { op(SETITEM); }

void Writer::reduce() {
  op(REDUCE);
  if (options_.memoizeAll)
    memoize();
}

void Writer::newObj() {
  op(NEWOBJ);
  if (options_.memoizeAll)
    memoize();
}

void Writer::build() { op(BUILD); }
void Writer::persistentId() { op(BINPERSID); }

Status Writer::writeValue(const Value &v, unsigned maxDepth) {
  if (maxDepth == 0)
    return makeError("pickle writer: value nested too deeply (or cyclic)");
  auto all = [&](const std::vector<Value *> &items) -> Status {
    for (const Value *item : items)
      if (Status s = writeValue(*item, maxDepth - 1); !s)
        return s;
    return Status::success();
  };
  // CPython batches APPENDS/SETITEMS by 1000 (a single item uses APPEND).
  constexpr size_t kBatch = 1000;
  auto listItems = [&](const std::vector<Value *> &items) -> Status {
    for (size_t start = 0; start < items.size(); start += kBatch) {
      size_t n = std::min(kBatch, items.size() - start);
      if (n > 1)
        mark();
      for (size_t i = start; i < start + n; ++i)
        if (Status s = writeValue(*items[i], maxDepth - 1); !s)
          return s;
      n > 1 ? appends() : append();
    }
    return Status::success();
  };
  auto dictItems = [&](const std::vector<std::pair<Value *, Value *>> &entries) -> Status {
    for (size_t start = 0; start < entries.size(); start += kBatch) {
      size_t n = std::min(kBatch, entries.size() - start);
      if (n > 1)
        mark();
      for (size_t i = start; i < start + n; ++i) {
        if (Status s = writeValue(*entries[i].first, maxDepth - 1); !s)
          return s;
        if (Status s = writeValue(*entries[i].second, maxDepth - 1); !s)
          return s;
      }
      n > 1 ? setItems() : setItem();
    }
    return Status::success();
  };

  switch (v.kind) {
  case Kind::None:
    none();
    break;
  case Kind::Bool:
    boolean(v.boolean);
    break;
  case Kind::Int:
    integer(v.integer);
    break;
  case Kind::BigInt:
    bigInteger(v.text);
    break;
  case Kind::Float:
    real(v.real);
    break;
  case Kind::String:
    string(v.text);
    break;
  case Kind::Bytes:
    bytes(v.text);
    break;
  case Kind::Global:
    global(v.text, v.name);
    break;
  case Kind::Tuple:
    if (v.items.empty()) {
      emptyTuple();
    } else if (v.items.size() <= 3) {
      if (Status s = all(v.items); !s)
        return s;
      tupleOf(static_cast<unsigned>(v.items.size()));
    } else {
      mark();
      if (Status s = all(v.items); !s)
        return s;
      tupleFromMark();
    }
    break;
  case Kind::List:
    emptyList();
    if (Status s = listItems(v.items); !s)
      return s;
    break;
  case Kind::Dict:
    emptyDict();
    if (Status s = dictItems(v.entries); !s)
      return s;
    break;
  case Kind::Object:
    if (!v.callable || v.callable->kind != Kind::Global || !v.args || v.args->kind != Kind::Tuple)
      return makeError("pickle writer: object without a global and an "
                       "argument tuple");
    global(v.callable->text, v.callable->name);
    if (Status s = writeValue(*v.args, maxDepth - 1); !s)
      return s;
    v.origin == Origin::NewObj ? newObj() : reduce();
    if (Status s = listItems(v.items); !s)
      return s;
    if (Status s = dictItems(v.entries); !s)
      return s;
    if (v.state) {
      if (Status s = writeValue(*v.state, maxDepth - 1); !s)
        return s;
      build();
    }
    break;
  case Kind::PersistentId:
    if (!v.args)
      return makeError("pickle writer: persistent id without a value");
    if (Status s = writeValue(*v.args, maxDepth - 1); !s)
      return s;
    persistentId();
    break;
  }
  return Status::success();
}

Status Writer::status() const {
  if (!error_.empty())
    return makeError(error_);
  return Status::success();
}

Result<std::string> Writer::finish() {
  if (!error_.empty())
    return makeError(error_);
  op(STOP);
  return std::move(out_);
}

} // namespace pickle
} // namespace fsdp
