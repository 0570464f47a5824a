//===- PickleWriter.cpp - The protocol-2 pickle writer --------------------===//
//
// Writer (Pickle.h): emits protocol 2 opcode by opcode, memoizing what the
// caller asks to share, and whole value trees (writeValue).
//
//===----------------------------------------------------------------------===//

#include "PickleInternal.h"
#include "fsdp/Format/Pickle.h"

#include <cstring>

namespace fsdp {
namespace pickle {

using namespace detail::opcodes;
using detail::isValidUtf8;

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
