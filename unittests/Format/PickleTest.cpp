//===- PickleTest.cpp - Restricted pickle reader, protocol-2 writer -------===//
//
// Expected bytes and reprs come from CPython 3.11 (`pickle.dumps(obj, 2)`,
// `repr(obj)`), recorded as hex below.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/Pickle.h"

#include "../TestSupport.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

using namespace fsdp;
using namespace fsdp::pickle;
using namespace std::string_literals;

namespace {

using fsdp_test::fromHex;

std::string reprOf(std::string_view bytes) {
  auto doc = read(bytes);
  if (!doc)
    return "error: " + doc.error();
  auto repr = toPythonRepr(*doc->root());
  return repr ? *repr : "error: " + repr.error();
}

std::string readError(std::string_view bytes, const ReadOptions &options = {}) {
  auto doc = read(bytes, options);
  return doc ? std::string("(no error)") : doc.error();
}

// pickle.dumps([0, 255, 256, 65535, 65536, -1, -2**31, 2**31-1, 2**31,
//               -2**31-1, 2**63-1, -2**63, 2**64, -2**64-5, 3000000000], 2)
const char *kIntsHex =
    "80025d7100284b004bff4d00014dffff4a000001004affffffff4a000000804affffff7f8a"
    "0500000080008a05ffffff7fff8a08ffffffffffffff7f8a0800000000000000808a090000"
    "000000000000018a09fbfffffffffffffffe8a05005ed0b200652e";
const char *kIntsRepr =
    "[0, 255, 256, 65535, 65536, -1, -2147483648, 2147483647, 2147483648, "
    "-2147483649, 9223372036854775807, -9223372036854775808, "
    "18446744073709551616, -18446744073709551621, 3000000000]";
// pickle.dumps((None, True, False, 1.5, -0.0, 1e-08, 'héllo', "it's", ''), 2)
const char *kMixedHex =
    "8002284e8889473ff8000000000000478000000000000000473e45798ee2308c3a58060000"
    "0068c3a96c6c6f71005804000000697427737101580000000071027471032e";
const char *kMixedRepr =
    "(None, True, False, 1.5, -0.0, 1e-08, 'h\xc3\xa9llo', \"it's\", '')";
// pickle.dumps({'a': [1, 2, (3,)], 'b': {}, 'c': (), 'd': (1, 2, 3, 4)}, 2)
const char *kNestedHex =
    "80027d71002858010000006171015d7102284b014b024b038571036558010000006271047d"
    "71055801000000637106295801000000647107284b014b024b034b04747108752e";
const char *kNestedRepr = "{'a': [1, 2, (3,)], 'b': {}, 'c': (), 'd': (1, 2, 3, 4)}";
// s = 'shared'; t = (s, s); pickle.dumps([t, t, 2**40, b'xy'], 4)
const char *kProtocol4Hex =
    "80049521000000000000005d94288c06736861726564946801869468028a06000000000001"
    "4302787994652e";
// pickle.dumps({'k': 1.25}, 5)
const char *kProtocol5Hex = "80059511000000000000007d948c016b94473ff4000000000000732e";

} // namespace

TEST(PickleReader, ReadsCPythonProtocol2) {
  EXPECT_EQ(reprOf(fromHex(kIntsHex)), kIntsRepr);
  EXPECT_EQ(reprOf(fromHex(kMixedHex)), kMixedRepr);
  EXPECT_EQ(reprOf(fromHex(kNestedHex)), kNestedRepr);
}

TEST(PickleReader, IntegerWidths) {
  auto doc = read(fromHex(kIntsHex));
  ASSERT_TRUE(doc) << doc.error();
  const auto &items = doc->root()->items;
  ASSERT_EQ(items.size(), 15u);
  EXPECT_EQ(items[10]->kind, Kind::Int);
  EXPECT_EQ(items[10]->integer, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(items[11]->kind, Kind::Int);
  EXPECT_EQ(items[11]->integer, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(items[12]->kind, Kind::BigInt); // 2**64 does not fit
  EXPECT_EQ(items[14]->kind, Kind::Int);
  EXPECT_EQ(items[14]->integer, 3000000000);
}

TEST(PickleReader, Protocol4MemoSharesNodes) {
  auto doc = read(fromHex(kProtocol4Hex));
  ASSERT_TRUE(doc) << doc.error();
  const Value *root = doc->root();
  ASSERT_EQ(root->kind, Kind::List);
  ASSERT_EQ(root->items.size(), 4u);
  // The same tuple object twice, holding the same string object twice.
  EXPECT_EQ(root->items[0], root->items[1]);
  EXPECT_EQ(root->items[0]->items[0], root->items[0]->items[1]);
  EXPECT_EQ(root->items[2]->integer, int64_t(1) << 40);
  EXPECT_EQ(reprOf(fromHex(kProtocol4Hex)),
            "[('shared', 'shared'), ('shared', 'shared'), 1099511627776, b'xy']");
  EXPECT_EQ(reprOf(fromHex(kProtocol5Hex)), "{'k': 1.25}");
}

TEST(PickleWriter, MatchesCPythonBytes) {
  Document doc;
  auto write = [&](Value *root) {
    Writer w(Writer::Options{/*memoizeAll=*/true});
    Status s = w.writeValue(*root);
    EXPECT_TRUE(s) << s.error();
    auto bytes = w.finish();
    EXPECT_TRUE(bytes) << bytes.error();
    return bytes ? *bytes : std::string();
  };
  // The same trees, re-written, give CPython's exact bytes.
  for (const char *hex : {kIntsHex, kMixedHex, kNestedHex}) {
    auto parsed = read(fromHex(hex));
    ASSERT_TRUE(parsed) << parsed.error();
    Writer w(Writer::Options{true});
    ASSERT_TRUE(w.writeValue(*parsed->root()));
    auto bytes = w.finish();
    ASSERT_TRUE(bytes);
    EXPECT_EQ(*bytes, fromHex(hex)) << hex;
  }
  // And trees built by hand.
  Value *list = doc.make(Kind::List);
  for (int64_t v : {int64_t(0), int64_t(255), int64_t(256), int64_t(65535),
                    int64_t(65536), int64_t(-1), int64_t(INT32_MIN),
                    int64_t(INT32_MAX), int64_t(1) << 31, int64_t(INT32_MIN) - 1,
                    std::numeric_limits<int64_t>::max(),
                    std::numeric_limits<int64_t>::min()})
    list->items.push_back(doc.makeInt(v));
  Value *big = doc.make(Kind::BigInt);
  big->text = fromHex("000000000000000001"); // 2**64
  list->items.push_back(big);
  Value *negBig = doc.make(Kind::BigInt);
  negBig->text = fromHex("fbfffffffffffffffe");
  list->items.push_back(negBig);
  list->items.push_back(doc.makeInt(3000000000));
  EXPECT_EQ(write(list), fromHex(kIntsHex));
}

TEST(PickleWriter, StreamingWithoutMemo) {
  // Without memoizeAll only globals are memoized (and reused).
  Writer w;
  w.global("torch", "Size");
  w.intTuple({2, 3});
  w.tupleOf(1);
  w.reduce();
  w.global("torch", "Size");
  w.intTuple({});
  w.tupleOf(1);
  w.reduce();
  w.tupleOf(2);
  auto bytes = w.finish();
  ASSERT_TRUE(bytes) << bytes.error();
  EXPECT_EQ(*bytes, "\x80\x02" "ctorch\nSize\nq\x00" "K\x02K\x03\x86\x85R"
                    "h\x00)\x85R\x86."s);
  auto doc = read(*bytes, ReadOptions{});
  ASSERT_TRUE(doc) << doc.error();
  EXPECT_EQ(*toPythonRepr(*doc->root()), "(torch.Size((2, 3)), torch.Size(()))");
  EXPECT_EQ(doc->root()->items[0]->callable, doc->root()->items[1]->callable);
}

TEST(PickleWriter, LargeListsAreBatched) {
  Document doc;
  Value *list = doc.make(Kind::List);
  for (int i = 0; i < 2500; ++i)
    list->items.push_back(doc.makeInt(i));
  Writer w;
  ASSERT_TRUE(w.writeValue(*list));
  auto bytes = w.finish();
  ASSERT_TRUE(bytes);
  // Three MARK ... APPENDS batches (1000, 1000, 500).
  size_t appends = 0;
  for (char c : *bytes)
    appends += c == 'e';
  EXPECT_GE(appends, 3u);
  auto back = read(*bytes);
  ASSERT_TRUE(back);
  ASSERT_EQ(back->root()->items.size(), 2500u);
  EXPECT_EQ(back->root()->items[2499]->integer, 2499);
}

TEST(PickleWriter, MemoLimitIsNamed) {
  // Protocol 2 numbers memo entries with 32 bits; the limit is lowered here
  // to reach it.
  Writer::Options options;
  options.memoLimit = 2;
  Writer w(options);
  w.sharedString("a");
  w.sharedString("b");
  EXPECT_TRUE(w.status().ok());
  w.sharedString("c");
  EXPECT_FALSE(w.status().ok());
  auto bytes = w.finish();
  ASSERT_FALSE(bytes);
  EXPECT_EQ(bytes.error(), "pickle writer: more than 2 memoized values; protocol 2 numbers memo "
                           "entries with 32 bits (LONG_BINPUT)");
}

TEST(PickleWriter, MemoSlotsAndPendingBytesChangeNoByte) {
  // Slots skip the lookup; pending()/clearPending() hand bytes on as they
  // come. Either way the pickle is the same, past BINPUT's 256 entries.
  auto write = [](bool slots, bool drain) {
    Writer w;
    Writer::MemoSlot size, name;
    std::string out;
    w.mark();
    for (int i = 0; i < 300; ++i) {
      slots ? w.global("torch", "Size", size) : w.global("torch", "Size");
      slots ? w.sharedString("offsets", name) : w.sharedString("offsets");
      w.sharedString("key" + std::to_string(i));
      w.tupleOf(3);
      if (drain) {
        out.append(w.pending());
        w.clearPending();
      }
    }
    w.tupleFromMark();
    auto rest = w.finish();
    EXPECT_TRUE(rest);
    return out + *rest;
  };
  std::string plain = write(false, false);
  EXPECT_EQ(write(true, false), plain);
  EXPECT_EQ(write(true, true), plain);
  EXPECT_TRUE(read(plain).ok());
}

TEST(PickleWriter, RejectsInvalidUtf8) {
  Writer w;
  w.string("\xff\xfe");
  auto bytes = w.finish();
  ASSERT_FALSE(bytes);
  EXPECT_NE(bytes.error().find("UTF-8"), std::string::npos);
}

TEST(PickleRepr, FloatsAsCPython) {
  Document doc;
  auto repr = [&](double v) {
    Value *f = doc.make(Kind::Float);
    f->real = v;
    return *toPythonRepr(*f);
  };
  EXPECT_EQ(repr(0.02), "0.02");
  EXPECT_EQ(repr(1e-08), "1e-08");
  EXPECT_EQ(repr(0.999), "0.999");
  EXPECT_EQ(repr(0.9), "0.9");
  EXPECT_EQ(repr(1e16), "1e+16");
  EXPECT_EQ(repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(repr(12345678901234567.0), "1.2345678901234568e+16");
  EXPECT_EQ(repr(123.0), "123.0");
  EXPECT_EQ(repr(0.0001), "0.0001");
  EXPECT_EQ(repr(1e-05), "1e-05");
  EXPECT_EQ(repr(1.5e-7), "1.5e-07");
  EXPECT_EQ(repr(-0.0), "-0.0");
  EXPECT_EQ(repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(repr(5e-324), "5e-324");
  EXPECT_EQ(repr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(repr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(repr(std::nan("")), "nan");
}

TEST(PickleRepr, StringsAsCPython) {
  Document doc;
  EXPECT_EQ(*toPythonRepr(*doc.makeString("it's")), "\"it's\"");
  EXPECT_EQ(*toPythonRepr(*doc.makeString("a\"b")), "'a\"b'");
  EXPECT_EQ(*toPythonRepr(*doc.makeString("it's \"x\"")), "'it\\'s \"x\"'");
  EXPECT_EQ(*toPythonRepr(*doc.makeString("a\nb\\")), "'a\\nb\\\\'");
}

TEST(PickleReader, AllowList) {
  EXPECT_TRUE(isDcpGlobal("torch.distributed.checkpoint.metadata", "Metadata"));
  EXPECT_TRUE(isDcpGlobal("torch", "Size"));
  EXPECT_TRUE(isDcpGlobal("torch", "bfloat16"));
  EXPECT_TRUE(isDcpGlobal("torch.serialization", "_get_layout"));
  EXPECT_TRUE(isDcpGlobal("torch._utils", "_rebuild_tensor_v2"));
  EXPECT_TRUE(isDcpGlobal("pathlib", "PosixPath"));
  EXPECT_TRUE(isDcpGlobal("pathlib._local", "PosixPath"));
  EXPECT_TRUE(isDcpGlobal("collections", "OrderedDict"));
  EXPECT_FALSE(isDcpGlobal("os", "system"));
  EXPECT_FALSE(isDcpGlobal("builtins", "eval"));
  EXPECT_FALSE(isDcpGlobal("torch", "load"));
  EXPECT_FALSE(isDcpGlobal("collections", "namedtuple"));
  EXPECT_FALSE(isDcpGlobal("torch.distributed.checkpoint.metadata", "os"));
  // Every dtype and legacy storage class the format knows, and only under torch.
  for (const char *name : {"float64", "float8_e4m3fn", "uint64", "bool", "complex32",
                           "UntypedStorage", "BFloat16Storage", "ComplexDoubleStorage"}) {
    EXPECT_TRUE(isDcpGlobal("torch", name)) << name;
    EXPECT_FALSE(isDcpGlobal("os", name)) << name;
  }
  EXPECT_FALSE(isDcpGlobal("torch", "float"));
  EXPECT_FALSE(isDcpGlobal("torch", "Storage"));
  EXPECT_FALSE(isDcpGlobal("torch", "Float8Storage"));
  EXPECT_FALSE(isDcpGlobal("torch", ""));
}

TEST(PickleErrors, DisallowedGlobalIsNamed) {
  std::string global = "\x80\x02" "cos\nsystem\nX\x02\x00\x00\x00ls\x85R."s;
  EXPECT_EQ(readError(global), "pickle: global 'os.system' is not allowed at offset 2");
  // STACK_GLOBAL (protocol 4) is checked the same way.
  std::string stack = "\x80\x04\x8c\x08" "builtins\x8c\x04" "eval\x93."s;
  EXPECT_EQ(readError(stack), "pickle: global 'builtins.eval' is not allowed at offset 18");
  // A caller may widen the list; the global is recorded, never resolved.
  ReadOptions all;
  all.allowGlobal = [](std::string_view, std::string_view) { return true; };
  auto doc = read(global, all);
  ASSERT_TRUE(doc) << doc.error();
  EXPECT_TRUE(doc->root()->isObjectOf("os", "system"));
}

TEST(PickleErrors, OpcodesAndStack) {
  using S = std::string;
  EXPECT_EQ(readError(S("\x80\x02\xff.", 4)), "pickle: unknown opcode 0xff at offset 2");
  EXPECT_EQ(readError(S("\x80\x04\x8f.", 4)),
            "pickle: unsupported opcode EMPTY_SET (0x8f) at offset 2");
  EXPECT_EQ(readError(S("\x80\x02K\x01\x86.", 6)),
            "pickle: stack underflow in TUPLE1/2/3 at offset 4");
  EXPECT_EQ(readError(S("\x80\x02]K\x01" "e.", 7)), "pickle: no MARK for APPENDS at offset 5");
  EXPECT_EQ(readError(S("\x80\x02h\x05.", 5)), "pickle: memo key 5 not found at offset 2");
  EXPECT_EQ(readError(S("\x80\x02]}b.", 6)), "pickle: BUILD on a list at offset 4");
  EXPECT_EQ(readError(S("\x80\x02])R.", 6)),
            "pickle: REDUCE of a list (only globals may be called) at offset 4");
  EXPECT_EQ(readError(S("\x80\x02NN.", 5)),
            "pickle: STOP with 2 values on the stack (expected 1) at offset 4");
  EXPECT_EQ(readError(S("\x80\x02X\x01\x00\x00\x00\xff.", 9)),
            "pickle: invalid UTF-8 in BINUNICODE at offset 2");
  EXPECT_EQ(readError(S("\x80\x06N.", 4)), "pickle: unsupported protocol 6 at offset 0");
  EXPECT_EQ(readError(S("\x80\x02(N.", 5)), "pickle: STOP inside an open MARK at offset 4");
  EXPECT_EQ(readError(S("", 0)), "pickle: truncated input (no STOP) at offset 0");
  // A length that runs past the end.
  EXPECT_EQ(readError(S("\x80\x02X\xff\xff\xff\x7f" "abc.", 11)),
            "pickle: truncated input in BINUNICODE at offset 2");
  EXPECT_EQ(readError(S("\x80\x02\x8a\x09\x01.", 6)),
            "pickle: truncated input in LONG1 at offset 2");
}

TEST(PickleErrors, EveryTruncationFailsCleanly) {
  for (const char *hex : {kIntsHex, kMixedHex, kNestedHex, kProtocol4Hex, kProtocol5Hex}) {
    std::string full = fromHex(hex);
    ASSERT_TRUE(read(full));
    for (size_t n = 0; n < full.size(); ++n) {
      std::string error = readError(full.substr(0, n));
      EXPECT_NE(error.find("at offset"), std::string::npos) << n << ": " << error;
    }
  }
}

TEST(PickleLimits, DeepNestingDoesNotRecurse) {
  // 200000 nested lists: the reader builds them without recursion; walkers
  // stop at their depth limit instead of overflowing the stack.
  const size_t depth = 200000;
  std::string bytes = "\x80\x02" + std::string(depth, ']') + std::string(depth - 1, 'a') + ".";
  auto doc = read(bytes);
  ASSERT_TRUE(doc) << doc.error();
  auto repr = toPythonRepr(*doc->root());
  ASSERT_FALSE(repr);
  EXPECT_NE(repr.error().find("too deeply"), std::string::npos);
  Writer w;
  Status s = w.writeValue(*doc->root());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().find("too deeply"), std::string::npos);

  std::string tuples = "\x80\x02)" + std::string(depth, '\x85') + ".";
  auto chain = read(tuples);
  ASSERT_TRUE(chain) << chain.error();
  EXPECT_FALSE(toPythonRepr(*chain->root()));
}

TEST(PickleLimits, CyclesAreCaughtByWalkers) {
  // l = []; l.append(l)
  auto doc = read("\x80\x02]q\x00h\x00" "a."s);
  ASSERT_TRUE(doc) << doc.error();
  EXPECT_EQ(doc->root()->items[0], doc->root());
  EXPECT_FALSE(toPythonRepr(*doc->root()));
}

TEST(PickleLimits, NodesGrowWithInput) {
  std::string bytes = "\x80\x02]" "(" + std::string(10000, 'N') + "e.";
  auto doc = read(bytes);
  ASSERT_TRUE(doc);
  EXPECT_LE(doc->nodeCount(), bytes.size());
}
