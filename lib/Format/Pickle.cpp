//===- Pickle.cpp - Pickle values, documents and their repr ---------------===//
//
// The value tree the reader builds and the writer can emit (Pickle.h), and
// toPythonRepr. The reader is PickleReader.cpp, the writer PickleWriter.cpp,
// the DCP allow-list PickleDcpGlobals.cpp.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/Pickle.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace fsdp {
namespace pickle {

namespace {

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

Result<std::string> toPythonRepr(const Value &value, unsigned maxDepth, size_t maxChars) {
  std::string out;
  if (Status s = appendRepr(value, maxDepth, maxChars, out); !s)
    return s.failure();
  return out;
}

} // namespace pickle
} // namespace fsdp
