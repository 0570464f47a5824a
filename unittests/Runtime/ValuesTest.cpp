//===- ValuesTest.cpp - Test values (--fill/--check) and float casts ------===//
//
// The test value formula against hand-computed cases, a 128-bit reference
// and the stdlib Python reference (test/Runtime/test_values.py); fill/check
// round trips for every dtype; the f32 <-> bf16/f16 conversions against
// slow references that search the target format's values (no bit tricks).
//
//===----------------------------------------------------------------------===//

#include "fsdp/Runtime/Values.h"
#include "fsdp/Runtime/Cast.h"

#include "../../runtime/CastKernels.h"
#include "../TestSupport.h"
#include "SlowFloat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

using namespace fsdp;
using namespace fsdp::runtime;
using dcp::DType;
using namespace fsdp_test;

namespace {

using fsdp_test::bitsOf;
using fsdp_test::floatOf;

const DType kSupported[] = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16,
                            DType::Int64,   DType::Int32,   DType::Int16,    DType::Int8,
                            DType::UInt8,   DType::UInt16,  DType::UInt32,   DType::UInt64,
                            DType::Bool};

const DType kUnsupported[] = {DType::Complex32,      DType::Complex64,  DType::Complex128,
                              DType::Float8E4M3FN,   DType::Float8E4M3FNUZ,
                              DType::Float8E5M2,     DType::Float8E5M2FNUZ,
                              DType::Float8E8M0FNU};

/// Checks one f32 -> 16-bit conversion against the slow reference; NaN must
/// stay NaN, keep its sign and be quiet.
void expectRounds(uint32_t bits, uint16_t (*fast)(float), uint16_t (*slow)(float),
                  uint16_t quietBit, uint16_t infBits, const char *what) {
  float x = floatOf(bits);
  uint16_t got = fast(x);
  if (std::isnan(x)) {
    EXPECT_EQ(got & 0x7fff & infBits, infBits) << what << " of NaN 0x" << std::hex << bits;
    EXPECT_TRUE((got & quietBit) != 0) << what << " of NaN 0x" << std::hex << bits << " -> 0x"
                                       << got;
    EXPECT_EQ(got >> 15, bits >> 31) << what << " NaN sign, 0x" << std::hex << bits;
    return;
  }
  uint16_t want = slow(x);
  EXPECT_EQ(got, want) << what << " of 0x" << std::hex << bits << " (" << std::hexfloat << x
                       << "): got 0x" << got << ", want 0x" << want;
}

/// f32 bit patterns worth checking by hand for both 16-bit formats.
std::vector<uint32_t> edgeFloats() {
  std::vector<uint32_t> bits = {
      0x00000000, 0x80000000, // +-0
      0x00000001, 0x80000001, 0x007fffff, 0x00800000, 0x00800001, // f32 subnormals, min normal
      0x3f800000, 0xbf800000, // +-1
      // bf16 ties around 1 (lsb 2^-7): 1 + 2^-8 (lsb even: down), 1 + 3*2^-8 (odd: up),
      // and one f32 ulp either side.
      0x3f808000, 0x3f807fff, 0x3f808001, 0x3f818000, 0x3f817fff, 0x3f818001, 0xbf818000,
      0x7f7fffff, 0xff7fffff, // max finite f32: overflows bf16 and f16
      0x7f7f7fff, 0x7f7f8000, 0x7f7f0000, 0x7f7effff, // bf16 max and the tie above it
      0x7f800000, 0xff800000, // +-inf
      0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fbfffff, 0x7fffffff, 0x7fa00000,
      0x7f802000, 0x7f800100, // NaNs (signalling with payload only in low bits too)
  };
  auto add = [&](float v) {
    bits.push_back(bitsOf(v));
    bits.push_back(bitsOf(-v));
    bits.push_back(bitsOf(v) + 1);
    bits.push_back(bitsOf(v) - 1);
  };
  // f16: max finite, the overflow tie, the first power past it.
  add(65504.0f);
  add(65520.0f);
  add(65536.0f);
  add(65519.0f);
  // f16 normal range edges and ties (lsb 2^-10 at 1.0, 1 at 1024).
  add(std::ldexp(1.0f, -14));       // smallest normal
  add(1.0f + std::ldexp(1.0f, -11)); // tie, lsb even: down
  add(1.0f + 3 * std::ldexp(1.0f, -11)); // tie, lsb odd: up
  add(2049.0f);                     // tie: 2048
  add(2051.0f);                     // tie: 2052
  add(std::ldexp(2047.0f, 4));      // 32752: tie between 32736 and 32768
  // f16 subnormals: 2^-24 units.
  add(std::ldexp(1.0f, -24));   // smallest subnormal
  add(std::ldexp(1.0f, -25));   // tie with 0: 0
  add(std::ldexp(3.0f, -26));   // 0.75 units: 1
  add(std::ldexp(3.0f, -25));   // 1.5 units, tie: 2
  add(std::ldexp(5.0f, -25));   // 2.5 units, tie: 2
  add(std::ldexp(1023.0f, -24)); // largest subnormal
  add(std::ldexp(2047.0f, -25)); // 1023.5 units: tie, up to the smallest normal
  add(std::ldexp(1.0f, -26));
  add(std::ldexp(1.0f, -40));
  // bf16 subnormals (same as f32's top bits) and the test values' range.
  add(std::ldexp(1.0f, -133));
  add(std::ldexp(1.0f, -126));
  add(127.96875f);
  add(1.0f / 256);
  return bits;
}

//===----------------------------------------------------------------------===//
// The formula
//===----------------------------------------------------------------------===//

/// Independent of the implementation's 64-bit arithmetic: 128-bit products,
/// then the 2^64 wrap made explicit.
__extension__ typedef unsigned __int128 Uint128; // GCC and Clang

int32_t testValue128(uint32_t keyHash, uint64_t index, uint32_t seed) {
  Uint128 sum = static_cast<Uint128>(index) * 7919 + static_cast<Uint128>(seed) * 104729 + keyHash;
  sum &= (static_cast<Uint128>(1) << 64) - 1;
  return static_cast<int32_t>(static_cast<uint64_t>(sum % 65521)) - 32760;
}

TEST(Values, Fnv1a32KnownVectors) {
  EXPECT_EQ(fnv1a32(""), 0x811c9dc5u);
  EXPECT_EQ(fnv1a32("a"), 0xe40c292cu);
  EXPECT_EQ(fnv1a32("b"), 0xe70c2de5u);
  EXPECT_EQ(fnv1a32("foobar"), 0xbf9cf968u);
  EXPECT_EQ(fnv1a32("model.p0"), 0x6678ac5cu); // test_values.py agrees (PythonReference)
  // Bytes, not characters: an embedded NUL counts, and so does every UTF-8 byte.
  EXPECT_NE(fnv1a32(std::string_view("a\0", 2)), fnv1a32("a"));
  uint32_t manual = 2166136261u;
  for (unsigned char c : std::string("\xc3\xa9t\xc3\xa9")) // "été"
    manual = (manual ^ c) * 16777619u;
  EXPECT_EQ(fnv1a32("\xc3\xa9t\xc3\xa9"), manual);
}

TEST(Values, HandComputed) {
  // Key "", hash 2166136261; seed 0, i 0:
  //   2166136261 = 65521 * 33060 + 12001 (65521 * 33060 = 2166124260), N = 12001 - 32760.
  EXPECT_EQ(testValue(fnv1a32(""), 0, 0), -20759);
  // i 1: 12001 + 7919 = 19920 < 65521, N = 19920 - 32760.
  EXPECT_EQ(testValue(fnv1a32(""), 1, 0), -12840);
  // seed 1, i 0: 12001 + 104729 = 116730 = 65521 + 51209, N = 51209 - 32760.
  EXPECT_EQ(testValue(fnv1a32(""), 0, 1), 18449);
  // Key "a", hash 3826002220 = 65521 * 58393 + 34467 (65521 * 58393 = 3825967753);
  // i 10, seed 3: 34467 + 79190 + 314187 = 427844 = 6 * 65521 + 34718, N = 34718 - 32760.
  EXPECT_EQ(testValue(fnv1a32("a"), 10, 3), 1958);
  // The 64-bit wrap (key "", seed 0): i = 2329428472224197 gives
  // i * 7919 + 2166136261 = 2^64 + 688, so S = 688 and N = 688 - 32760; the
  // element before does not wrap: S = 18446744073709544385, S mod 65521 = 43394.
  EXPECT_EQ(testValue(fnv1a32(""), 2329428472224197ull, 0), -32072);
  EXPECT_EQ(testValue(fnv1a32(""), 2329428472224196ull, 0), 10634);
  // Extremes of the range: S mod 65521 = 0 and 65520.
  // Key "" seed 0: residue 0 at i with 12001 + 7919 i = 0 (mod 65521).
  uint64_t zeroAt = 0;
  while ((12001 + 7919 * zeroAt) % 65521 != 0)
    ++zeroAt;
  EXPECT_EQ(testValue(fnv1a32(""), zeroAt, 0), -32760);
  uint64_t topAt = 0;
  while ((12001 + 7919 * topAt) % 65521 != 65520)
    ++topAt;
  EXPECT_EQ(testValue(fnv1a32(""), topAt, 0), 32760);
}

TEST(Values, RandomAgainst128BitReference) {
  std::mt19937_64 rng(12345);
  for (int n = 0; n < 1000000; ++n) {
    uint32_t hash = static_cast<uint32_t>(rng());
    uint64_t index = rng();
    if (n % 3 == 0)
      index >>= (rng() % 64); // small indices too
    uint32_t seed = static_cast<uint32_t>(rng() % (1u << 31));
    int32_t value = testValue(hash, index, seed);
    ASSERT_GE(value, -32760);
    ASSERT_LE(value, 32760);
    ASSERT_EQ(value, testValue128(hash, index, seed))
        << "hash " << hash << " index " << index << " seed " << seed;
  }
}

TEST(Values, EveryValueOncePerPeriod) {
  // 7919 and the prime 65521 are coprime: 65521 consecutive elements take
  // every N in [-32760, 32760] exactly once.
  std::vector<int> seen(65521, 0);
  uint32_t hash = fnv1a32("layers.0.weight");
  for (uint64_t i = 1000; i < 1000 + 65521; ++i)
    ++seen[testValue(hash, i, 42) + 32760];
  for (int count : seen)
    ASSERT_EQ(count, 1);
}

//===----------------------------------------------------------------------===//
// fill / check
//===----------------------------------------------------------------------===//

/// The expected bytes of one element, built the slow way from testValue.
std::vector<unsigned char> expectedElement(DType dtype, int32_t n) {
  std::vector<unsigned char> bytes(dcp::dtypeInfo(dtype).elementSize);
  auto put = [&](auto value) {
    ASSERT_EQ(sizeof(value), bytes.size());
    std::memcpy(bytes.data(), &value, sizeof(value));
  };
  double real = n / 256.0;
  switch (dtype) {
  case DType::Float64: put(real); break;
  case DType::Float32: put(static_cast<float>(real)); break;
  case DType::BFloat16: put(bfloat16Slow(static_cast<float>(real))); break;
  case DType::Float16: put(halfSlow(static_cast<float>(real))); break;
  case DType::Int64: put(static_cast<int64_t>(n)); break;
  case DType::Int32: put(static_cast<int32_t>(n)); break;
  case DType::Int16: put(static_cast<int16_t>(n)); break;
  case DType::Int8: put(static_cast<int8_t>(((n % 256) + 256 + 128) % 256 - 128)); break;
  case DType::UInt8: put(static_cast<uint8_t>(((n % 256) + 256) % 256)); break;
  case DType::UInt16: put(static_cast<uint16_t>(((n % 65536) + 65536) % 65536)); break;
  case DType::UInt32: put(static_cast<uint32_t>(n < 0 ? 4294967296ll + n : n)); break;
  case DType::UInt64: put(n < 0 ? std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(-n) + 1
                                : static_cast<uint64_t>(n)); break;
  case DType::Bool: put(static_cast<uint8_t>(n % 2 != 0 ? 1 : 0)); break;
  default: ADD_FAILURE() << "unexpected dtype"; break;
  }
  return bytes;
}

void expectFillMatches(DType dtype, const std::string &key, uint64_t first, uint64_t count,
                       uint32_t seed) {
  SCOPED_TRACE(std::string(dcp::dtypeInfo(dtype).name) + " key " + key + " first " +
               std::to_string(first) + " seed " + std::to_string(seed));
  size_t size = dcp::dtypeInfo(dtype).elementSize;
  // One byte of misalignment, and guard bytes that must stay untouched.
  std::vector<unsigned char> buffer(count * size + 2, 0xa5);
  uint32_t hash = fnv1a32(key);
  Status filled = fillTestValues(dtype, hash, first, count, seed, buffer.data() + 1);
  ASSERT_TRUE(filled) << filled.error();
  EXPECT_EQ(buffer.front(), 0xa5);
  EXPECT_EQ(buffer.back(), 0xa5);
  for (uint64_t j = 0; j < count; ++j) {
    std::vector<unsigned char> want = expectedElement(dtype, testValue128(hash, first + j, seed));
    ASSERT_EQ(std::memcmp(buffer.data() + 1 + j * size, want.data(), size), 0) << "element " << j;
  }
  Status checked = checkTestValues(dtype, hash, first, count, seed, buffer.data() + 1);
  EXPECT_TRUE(checked) << checked.error();
  // Another seed or key does not check (with enough elements: one f16 or
  // bool element may well agree).
  if (count >= 100) {
    EXPECT_FALSE(checkTestValues(dtype, hash, first, count, seed + 1, buffer.data() + 1));
    EXPECT_FALSE(checkTestValues(dtype, hash ^ 1, first, count, seed, buffer.data() + 1));
  }
}

TEST(Values, FillThenCheckEveryDType) {
  for (DType dtype : kSupported) {
    expectFillMatches(dtype, "model.p0", 0, 70000, 7); // more than one period
    expectFillMatches(dtype, "layers.3.mlp.fc1.weight", 123456789, 1000, 0);
    expectFillMatches(dtype, "\xc3\xa9t\xc3\xa9", 5, 17, 2147483647u);
    expectFillMatches(dtype, "", 0, 1, 1); // a scalar
    expectFillMatches(dtype, "x", 0, 0, 1); // nothing
    // Across the 64-bit wrap of the sum (see HandComputed).
    expectFillMatches(dtype, "", 2329428472224197ull - 500, 1000, 0);
    // At the very end of the index space.
    expectFillMatches(dtype, "end", std::numeric_limits<uint64_t>::max() - 99, 100, 9);
  }
}

TEST(Values, FillPiecesEqualWhole) {
  // A rank fills its chunk at its global offset: pieces equal the whole.
  std::vector<float> whole(10000), pieces(10000);
  uint32_t hash = fnv1a32("w");
  ASSERT_TRUE(fillTestValues(DType::Float32, hash, 0, 10000, 3, whole.data()));
  for (uint64_t begin : {0, 1, 3333, 7000, 9999}) {
    uint64_t end = begin == 0 ? 1 : begin == 1 ? 3333 : begin == 3333 ? 7000 : begin == 7000 ? 9999 : 10000;
    ASSERT_TRUE(fillTestValues(DType::Float32, hash, begin, end - begin, 3, pieces.data() + begin));
    ASSERT_TRUE(checkTestValues(DType::Float32, hash, begin, end - begin, 3, whole.data() + begin));
  }
  EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), whole.size() * 4), 0);
}

TEST(Values, KnownFirstValues) {
  // Key "model.p0" seed 7 (as `test_values.py` prints by default).
  uint32_t hash = fnv1a32("model.p0");
  float f32[8];
  ASSERT_TRUE(fillTestValues(DType::Float32, hash, 0, 8, 7, f32));
  const float wantF32[8] = {94.1015625f, 125.03515625f, -99.97265625f, -69.0390625f,
                            -38.10546875f, -7.171875f, 23.76171875f, 54.6953125f};
  for (int j = 0; j < 8; ++j)
    EXPECT_EQ(f32[j], wantF32[j]) << j;
  uint16_t bf16[8], f16[8];
  ASSERT_TRUE(fillTestValues(DType::BFloat16, hash, 0, 8, 7, bf16));
  ASSERT_TRUE(fillTestValues(DType::Float16, hash, 0, 8, 7, f16));
  const float wantBf16[8] = {94, 125, -100, -69, -38, -7.1875f, 23.75f, 54.75f};
  const float wantF16[8] = {94.125f, 125.0625f, -100, -69.0625f, -38.09375f, -7.171875f,
                            23.765625f, 54.6875f};
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(bfloat16ToFloat(bf16[j]), wantBf16[j]) << j;
    EXPECT_EQ(halfToFloat(f16[j]), wantF16[j]) << j;
  }
  int8_t i8[8];
  uint8_t b[8];
  ASSERT_TRUE(fillTestValues(DType::Int8, hash, 0, 8, 7, i8));
  ASSERT_TRUE(fillTestValues(DType::Bool, hash, 0, 8, 7, b));
  const int8_t wantI8[8] = {26, 9, 7, -10, -27, -44, -61, -78}; // N = 24090, 32009, -25593, ...
  const uint8_t wantBool[8] = {0, 1, 1, 0, 1, 0, 1, 0};
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(i8[j], wantI8[j]) << j;
    EXPECT_EQ(b[j], wantBool[j]) << j;
  }
}

TEST(Values, CheckReportsFirstMismatch) {
  uint32_t hash = fnv1a32("model.p0");
  // Element 3 of this key and seed is -69.0390625 (N = -17674).
  std::vector<float> f32(100);
  ASSERT_TRUE(fillTestValues(DType::Float32, hash, 0, 100, 7, f32.data()));
  f32[50] = 1;
  f32[3] = 0.5f;
  Status status = checkTestValues(DType::Float32, hash, 0, 100, 7, f32.data());
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "element 3: found 0.5, expected -69.0390625");

  // The index is global: the same buffer checked as elements [1000, 1100).
  std::vector<double> f64(100);
  ASSERT_TRUE(fillTestValues(DType::Float64, hash, 1000, 100, 7, f64.data()));
  f64[97] = -3.25;
  status = checkTestValues(DType::Float64, hash, 1000, 100, 7, f64.data());
  ASSERT_FALSE(status);
  double want = testValue(hash, 1097, 7) / 256.0;
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", want);
  EXPECT_EQ(status.error(), "element 1097: found -3.25, expected " + std::string(text));

  std::vector<uint16_t> bf16(8), f16(8);
  ASSERT_TRUE(fillTestValues(DType::BFloat16, hash, 0, 8, 7, bf16.data()));
  ASSERT_TRUE(fillTestValues(DType::Float16, hash, 0, 8, 7, f16.data()));
  bf16[3] = floatToBFloat16(-3.25f);
  f16[3] = 0x7e00; // NaN
  status = checkTestValues(DType::BFloat16, hash, 0, 8, 7, bf16.data());
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "element 3: found -3.25, expected -69");
  status = checkTestValues(DType::Float16, hash, 0, 8, 7, f16.data());
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "element 3: found nan, expected -69.0625");

  std::vector<int16_t> i16(8);
  ASSERT_TRUE(fillTestValues(DType::Int16, hash, 0, 8, 7, i16.data()));
  i16[7] = 0;
  status = checkTestValues(DType::Int16, hash, 0, 8, 7, i16.data());
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "element 7: found 0, expected 14002");

  std::vector<uint8_t> b(8);
  ASSERT_TRUE(fillTestValues(DType::Bool, hash, 0, 8, 7, b.data()));
  b[1] = 2; // not a valid bool, though "true"
  status = checkTestValues(DType::Bool, hash, 0, 8, 7, b.data());
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "element 1: found 2, expected 1");

  std::vector<uint64_t> u64(8);
  ASSERT_TRUE(fillTestValues(DType::UInt64, hash, 0, 8, 7, u64.data()));
  u64[2] = 0;
  status = checkTestValues(DType::UInt64, hash, 0, 8, 7, u64.data());
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "element 2: found 0, expected 18446744073709526023");
}

TEST(Values, CheckComparesBitsNotValues) {
  // N = 0 stores +0; a -0 there is a mismatch although -0 == +0.
  uint32_t hash = fnv1a32("zero");
  uint64_t at = 0;
  while (testValue(hash, at, 1) != 0)
    ++at;
  std::vector<float> f32(at + 1);
  ASSERT_TRUE(fillTestValues(DType::Float32, hash, 0, at + 1, 1, f32.data()));
  ASSERT_EQ(bitsOf(f32[at]), 0u);
  f32[at] = -0.0f;
  Status status = checkTestValues(DType::Float32, hash, 0, at + 1, 1, f32.data());
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "element " + std::to_string(at) + ": found -0, expected 0");
}

TEST(Values, CheckAcrossTheWrap) {
  // A mismatch found after the run boundary reports the right index.
  uint64_t first = 2329428472224197ull - 10;
  std::vector<int32_t> i32(20);
  uint32_t hash = fnv1a32("");
  ASSERT_TRUE(fillTestValues(DType::Int32, hash, first, 20, 0, i32.data()));
  EXPECT_EQ(i32[10], -32072);
  EXPECT_EQ(i32[9], 10634);
  i32[12] = 99999;
  Status status = checkTestValues(DType::Int32, hash, first, 20, 0, i32.data());
  ASSERT_FALSE(status);
  EXPECT_EQ(status.error(), "element " + std::to_string(first + 12) + ": found 99999, expected " +
                                std::to_string(testValue128(hash, first + 12, 0)));
}

TEST(Values, UnsupportedDTypes) {
  unsigned char buffer[64] = {};
  for (DType dtype : kUnsupported) {
    std::string name = dcp::dtypeInfo(dtype).name;
    Status fill = fillTestValues(dtype, 1, 0, 2, 0, buffer);
    ASSERT_FALSE(fill) << name;
    EXPECT_NE(fill.error().find(name), std::string::npos) << fill.error();
    Status check = checkTestValues(dtype, 1, 0, 2, 0, buffer);
    ASSERT_FALSE(check) << name;
    EXPECT_NE(check.error().find(name), std::string::npos) << check.error();
  }
  for (unsigned char byte : buffer)
    EXPECT_EQ(byte, 0); // nothing written
  Status bogus = fillTestValues(static_cast<DType>(200), 1, 0, 2, 0, buffer);
  ASSERT_FALSE(bogus);
  EXPECT_NE(bogus.error().find("#200"), std::string::npos) << bogus.error();
}

//===----------------------------------------------------------------------===//
// f32 <-> bf16 / f16
//===----------------------------------------------------------------------===//

TEST(Values, BFloat16EdgeCases) {
  for (uint32_t bits : edgeFloats())
    expectRounds(bits, floatToBFloat16, bfloat16Slow, 0x0040, 0x7f80, "bf16");
  // Spelled out.
  EXPECT_EQ(floatToBFloat16(floatOf(0x3f808000)), 0x3f80); // tie, even: down
  EXPECT_EQ(floatToBFloat16(floatOf(0x3f818000)), 0x3f82); // tie, odd: up
  EXPECT_EQ(floatToBFloat16(floatOf(0x7f7fffff)), 0x7f80); // overflow to inf
  EXPECT_EQ(floatToBFloat16(floatOf(0x7f7f7fff)), 0x7f7f); // just below the tie: max finite
  EXPECT_EQ(floatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(floatToBFloat16(floatOf(0x7f800001)), 0x7fc0); // sNaN: quiet, not inf
  EXPECT_EQ(floatToBFloat16(floatOf(0xffc00000)), 0xffc0);
  EXPECT_EQ(floatToBFloat16(floatOf(0x00010000)), 0x0001); // f32 subnormal, exact
}

TEST(Values, HalfEdgeCases) {
  for (uint32_t bits : edgeFloats())
    expectRounds(bits, floatToHalf, halfSlow, 0x0200, 0x7c00, "f16");
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.996f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(floatToHalf(-1e30f), 0xfc00);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(floatToHalf(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(floatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(floatToHalf(std::ldexp(5.0f, -25)), 0x0002);
  EXPECT_EQ(floatToHalf(std::ldexp(2047.0f, -25)), 0x0400);
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(floatToHalf(floatOf(0x7f800001)), 0x7e00); // sNaN: quiet, not inf
  EXPECT_EQ(floatToHalf(floatOf(0xffc02000)), 0xfe01); // sign and top payload kept
}

TEST(Values, BFloat16RandomSample) {
  std::mt19937 rng(2024);
  for (int n = 0; n < 1000000; ++n) {
    uint32_t bits = rng();
    float x = floatOf(bits);
    if (std::isnan(x)) {
      expectRounds(bits, floatToBFloat16, bfloat16Slow, 0x0040, 0x7f80, "bf16");
      continue;
    }
    uint16_t got = floatToBFloat16(x), want = bfloat16Slow(x);
    ASSERT_EQ(got, want) << "0x" << std::hex << bits;
  }
}

TEST(Values, HalfRandomSample) {
  std::mt19937 rng(4096);
  for (int n = 0; n < 1000000; ++n) {
    uint32_t bits = rng();
    if (n % 2) // half of them in or near f16's exponent range (2^-26 .. 2^17)
      bits = (bits & 0x807fffffu) | ((101 + rng() % 43) << 23);
    float x = floatOf(bits);
    if (std::isnan(x)) {
      expectRounds(bits, floatToHalf, halfSlow, 0x0200, 0x7c00, "f16");
      continue;
    }
    uint16_t got = floatToHalf(x), want = halfSlow(x);
    ASSERT_EQ(got, want) << "0x" << std::hex << bits;
  }
}

TEST(Values, BFloat16ToFloatExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float x = bfloat16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(bitsOf(x), h << 16) << std::hex << h;
    bool nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
    if (!nan) {
      double magnitude = bfloat16Magnitude(h & 0x7fff);
      if ((h & 0x7fff) != 0x7f80) {
        ASSERT_EQ(std::fabs(static_cast<double>(x)), magnitude) << std::hex << h;
      }
      ASSERT_EQ(floatToBFloat16(x), h) << std::hex << h;
    } else {
      ASSERT_TRUE(std::isnan(x));
      ASSERT_EQ(floatToBFloat16(x), h | 0x0040) << std::hex << h; // signalling ones get quiet
    }
  }
}

TEST(Values, HalfToFloatExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float x = halfToFloat(static_cast<uint16_t>(h));
    uint32_t magnitude = h & 0x7fff;
    EXPECT_EQ(std::signbit(x), (h & 0x8000) != 0) << std::hex << h;
    if (magnitude > 0x7c00) {
      ASSERT_TRUE(std::isnan(x)) << std::hex << h;
      EXPECT_EQ((bitsOf(x) >> 13) & 0x3ff, h & 0x3ff) << "payload of 0x" << std::hex << h;
      ASSERT_EQ(floatToHalf(x), h | 0x0200) << std::hex << h;
    } else {
      if (magnitude == 0x7c00)
        ASSERT_TRUE(std::isinf(x)) << std::hex << h;
      else
        ASSERT_EQ(std::fabs(static_cast<double>(x)), halfMagnitude(magnitude)) << std::hex << h;
      ASSERT_EQ(floatToHalf(x), h) << std::hex << h;
    }
  }
}

TEST(Values, HalfFromEveryFloatNearItsRange) {
  // Every f32 between +-2^-26 and +-2^17 whose low 8 mantissa bits are one of
  // a few patterns: 2 signs x 43 exponents x 2^15 x 4 (~11M): every tie and
  // neighbour of a tie at every f16 exponent, including subnormals.
  const uint32_t lows[] = {0x00, 0x01, 0x80, 0xff};
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t exponent = 101; exponent < 144; ++exponent)
      for (uint32_t high = 0; high < (1u << 15); ++high)
        for (uint32_t low : lows) {
          uint32_t bits = sign << 31 | exponent << 23 | high << 8 | low;
          float x = floatOf(bits);
          uint16_t got = floatToHalf(x);
          // Cheap reference here: the neighbours in f16 by decoding, no search.
          // (roundSlow for all 11M would be slow; sample every 97th with it.)
          if ((high + low) % 97 == 0) {
            ASSERT_EQ(got, halfSlow(x)) << std::hex << bits;
          }
          double a = std::fabs(static_cast<double>(x));
          uint32_t code = got & 0x7fff;
          double value = code >= 0x7c00 ? 65536.0 : halfMagnitude(code);
          double below = code == 0 ? 0.0 : halfMagnitude(code - 1);
          double above = code >= 0x7c00 ? 65536.0 : halfMagnitude(code + 1);
          // got is the nearest: no neighbour strictly closer, ties to even.
          ASSERT_LE(std::fabs(a - value), std::fabs(a - below)) << std::hex << bits;
          if (code < 0x7c00) {
            ASSERT_LE(std::fabs(a - value), std::fabs(above - a)) << std::hex << bits;
          } else {
            ASSERT_GE(a, 65520.0) << std::hex << bits;
          }
          if (code && std::fabs(a - value) == std::fabs(a - below)) {
            ASSERT_EQ(code & 1, 0u) << "tie not even, 0x" << std::hex << bits;
          }
          if (code < 0x7c00 && std::fabs(a - value) == std::fabs(above - a)) {
            ASSERT_EQ(code & 1, 0u) << "tie not even, 0x" << std::hex << bits;
          }
          ASSERT_EQ(got >> 15, sign);
        }
}

//===----------------------------------------------------------------------===//
// castElements
//===----------------------------------------------------------------------===//

/// The f32 -> bf16/f16 loops are built for several instruction sets: each
/// one this CPU runs is bit for bit the scalar conversions, on every kind of
/// value (NaN payloads, ties, overflow, subnormals) and at every start and
/// tail length a vector loop splits differently; castElements runs the best.
TEST(Values, VectorCastsEqualTheScalarOnesBitForBit) {
  std::mt19937 rng(4242);
  std::vector<uint32_t> bits(1 << 20);
  for (uint32_t &b : bits)
    b = rng();
  // Around the rounding points of both formats, for every sign and exponent.
  for (uint32_t top = 0; top < 512; ++top)
    for (uint32_t low : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x2fffu, 0x7fffu, 0x8000u,
                         0x8001u, 0x17fffu, 0x18000u, 0x7fffffu})
      bits.push_back(top << 23 | low);
  std::vector<float> in(bits.size());
  std::memcpy(in.data(), bits.data(), bits.size() * 4);
  std::vector<uint16_t> bf16(in.size()), f16(in.size());
  std::vector<FloatCastKernels> kernels = runnableFloatCastKernels();
  ASSERT_STREQ(kernels.front().isa, "baseline");
  for (const FloatCastKernels &kernel : kernels) {
    SCOPED_TRACE(kernel.isa);
    for (size_t start : {0, 1, 3, 7}) {
      for (size_t tail : {0, 1, 5, 15, 31}) {
        size_t n = in.size() - start - tail;
        kernel.toBFloat16(in.data() + start, bf16.data(), n);
        kernel.toHalf(in.data() + start, f16.data(), n);
        for (size_t j = 0; j < n; ++j) {
          ASSERT_EQ(bf16[j], floatToBFloat16(in[start + j])) << std::hex << bits[start + j];
          ASSERT_EQ(f16[j], floatToHalf(in[start + j])) << std::hex << bits[start + j];
        }
        // The copying cast: the same bf16, and the source's bytes copied,
        // into outputs at the start, an odd byte, and even offsets up to the
        // end of a 64-byte line (its vector stores stream from the first
        // aligned line on; an odd address never streams), and copies at
        // the start of a line, or off it (the copy streams where its lines
        // line up with the output's).
        for (size_t outAt : {0, 1, 2, 30, 62}) {
          for (size_t copyAt : {0, 4, 32, 60}) {
            SCOPED_TRACE(std::to_string(outAt) + " " + std::to_string(copyAt));
            auto lineIn = [](std::vector<unsigned char> &bytes) {
              return bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64);
            };
            std::vector<unsigned char> castAsCopied(2 * n + 128, 0xee), copied(4 * n + 128, 0xdd);
            unsigned char *out = lineIn(castAsCopied) + outAt, *copy = lineIn(copied) + copyAt;
            kernel.copyToBFloat16(in.data() + start, copy, out, n);
            ASSERT_EQ(std::memcmp(out, bf16.data(), 2 * n), 0);
            ASSERT_EQ(out[2 * n], 0xee); // nothing past the end
            ASSERT_EQ(std::memcmp(copy, in.data() + start, 4 * n), 0);
            ASSERT_EQ(copy[4 * n], 0xdd);
            ASSERT_EQ(copy[-1], 0xdd); // nor before the start
          }
        }
      }
    }
  }
  // castElements' pick, on an unaligned output.
  std::vector<unsigned char> out(2 * in.size() + 1);
  ASSERT_TRUE(castElements(DType::Float32, in.data(), DType::BFloat16, out.data() + 1, in.size()));
  kernels.back().toBFloat16(in.data(), bf16.data(), in.size());
  EXPECT_EQ(std::memcmp(out.data() + 1, bf16.data(), 2 * in.size()), 0);
}

TEST(Values, CopyAndCastIsACopyAndACastInEveryDtypePair) {
  std::mt19937 rng(91);
  const uint64_t n = 3 * 4096 + 5; // runs of the chunked copy, and a tail
  std::vector<double> values(n);
  for (double &v : values)
    v = (static_cast<double>(rng()) - 2147483648.0) * 1e-3;
  values[0] = std::numeric_limits<double>::quiet_NaN();
  for (DType from : {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16})
    for (DType to : {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16}) {
      SCOPED_TRACE(std::string(dcp::dtypeInfo(from).name) + " -> " + dcp::dtypeInfo(to).name);
      uint64_t fromSize = dcp::dtypeInfo(from).elementSize;
      uint64_t toSize = dcp::dtypeInfo(to).elementSize;
      std::vector<unsigned char> in(fromSize * n), copy(fromSize * n + 1, 0xee);
      std::vector<unsigned char> cast(toSize * n + 1), expected(toSize * n + 1);
      ASSERT_TRUE(castElements(DType::Float64, values.data(), from, in.data(), n));
      ASSERT_TRUE(castElements(from, in.data(), to, expected.data() + 1, n));
      // Unaligned copy and output.
      ASSERT_TRUE(copyAndCastElements(from, in.data(), copy.data() + 1, to, cast.data() + 1, n));
      EXPECT_EQ(std::memcmp(copy.data() + 1, in.data(), in.size()), 0);
      EXPECT_EQ(copy[0], 0xee);
      EXPECT_EQ(std::memcmp(cast.data() + 1, expected.data() + 1, toSize * n), 0);
    }
  std::vector<int64_t> integers(8, 3), copy(8), out(8);
  Status refused = copyAndCastElements(DType::Int64, integers.data(), copy.data(),
                                       DType::Float32, out.data(), 8);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().find("cannot cast int64 to float32"), std::string::npos)
      << refused.error();
}

TEST(Values, CastBetweenFloatTypes) {
  std::mt19937 rng(77);
  std::vector<float> f32(4096);
  for (float &x : f32) {
    x = floatOf(rng());
    if (std::isnan(x))
      x = 1.5f;
  }
  f32[0] = 65520.0f;
  f32[1] = -0.0f;
  f32[2] = std::numeric_limits<float>::infinity();
  f32[3] = std::numeric_limits<float>::quiet_NaN();
  size_t n = f32.size();

  // f32 -> bf16, f16 element by element; unaligned output.
  std::vector<unsigned char> bytes(2 * n + 1);
  ASSERT_TRUE(castElements(DType::Float32, f32.data(), DType::BFloat16, bytes.data() + 1, n));
  for (size_t j = 0; j < n; ++j) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 1 + 2 * j, 2);
    ASSERT_EQ(h, floatToBFloat16(f32[j])) << j;
  }
  std::vector<uint16_t> f16(n), bf16(n);
  ASSERT_TRUE(castElements(DType::Float32, f32.data(), DType::Float16, f16.data(), n));
  ASSERT_TRUE(castElements(DType::Float32, f32.data(), DType::BFloat16, bf16.data(), n));
  for (size_t j = 0; j < n; ++j)
    ASSERT_EQ(f16[j], floatToHalf(f32[j])) << j;
  EXPECT_EQ(f16[0], 0x7c00);
  EXPECT_EQ(f16[1], 0x8000);

  // 16-bit -> f32 and f64 are exact.
  std::vector<float> back(n);
  std::vector<double> wide(n);
  ASSERT_TRUE(castElements(DType::Float16, f16.data(), DType::Float32, back.data(), n));
  ASSERT_TRUE(castElements(DType::BFloat16, bf16.data(), DType::Float64, wide.data(), n));
  for (size_t j = 0; j < n; ++j) {
    ASSERT_EQ(bitsOf(back[j]), bitsOf(halfToFloat(f16[j]))) << j;
    if (std::isnan(bfloat16ToFloat(bf16[j])))
      ASSERT_TRUE(std::isnan(wide[j]));
    else
      ASSERT_EQ(wide[j], static_cast<double>(bfloat16ToFloat(bf16[j]))) << j;
  }

  // bf16 <-> f16 through f32.
  std::vector<uint16_t> cross(n);
  ASSERT_TRUE(castElements(DType::BFloat16, bf16.data(), DType::Float16, cross.data(), n));
  for (size_t j = 0; j < n; ++j)
    ASSERT_EQ(cross[j], floatToHalf(bfloat16ToFloat(bf16[j]))) << j;
  ASSERT_TRUE(castElements(DType::Float16, f16.data(), DType::BFloat16, cross.data(), n));
  for (size_t j = 0; j < n; ++j)
    ASSERT_EQ(cross[j], floatToBFloat16(halfToFloat(f16[j]))) << j;

  // f64 -> f32 rounds to nearest; f32 -> f64 exact.
  std::vector<double> f64 = {1.0 + std::ldexp(1.0, -24), 1.0 + 3 * std::ldexp(1.0, -24), 1e300,
                             -1e-300, 0.1};
  std::vector<float> narrow(f64.size());
  ASSERT_TRUE(castElements(DType::Float64, f64.data(), DType::Float32, narrow.data(), f64.size()));
  EXPECT_EQ(narrow[0], 1.0f);
  EXPECT_EQ(narrow[1], 1.0f + std::ldexp(1.0f, -22));
  EXPECT_TRUE(std::isinf(narrow[2]));
  EXPECT_EQ(bitsOf(narrow[3]), 0x80000000u);
  EXPECT_EQ(narrow[4], 0.1f);
  std::vector<double> again(f64.size());
  ASSERT_TRUE(castElements(DType::Float32, narrow.data(), DType::Float64, again.data(), f64.size()));
  EXPECT_EQ(again[4], static_cast<double>(0.1f));
}

TEST(Values, CastFromDoubleRoundsThroughFloat) {
  // As c10::BFloat16 / c10::Half (built from float) do for a double tensor:
  // 1 + 2^-8 + 2^-30 rounds to the f32 tie 1 + 2^-8, then to even, 1.0 (a
  // direct rounding would give 1 + 2^-7).
  double x[2] = {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30), 1e6};
  uint16_t bf16[2], f16[2];
  ASSERT_TRUE(castElements(DType::Float64, x, DType::BFloat16, bf16, 2));
  ASSERT_TRUE(castElements(DType::Float64, x, DType::Float16, f16, 2));
  EXPECT_EQ(bf16[0], 0x3f80);
  EXPECT_EQ(bf16[1], floatToBFloat16(1e6f));
  EXPECT_EQ(f16[1], 0x7c00); // overflow
}

TEST(Values, CastSameDTypeCopies) {
  std::vector<int32_t> in = {1, -2, 3, 0x7fffffff}, out(4, 0);
  ASSERT_TRUE(castElements(DType::Int32, in.data(), DType::Int32, out.data(), 4));
  EXPECT_EQ(in, out);
  // NaN payloads survive a same-dtype cast (a copy, not a round trip).
  uint16_t nan[2] = {0x7c01, 0xffff}, copy[2] = {};
  ASSERT_TRUE(castElements(DType::Float16, nan, DType::Float16, copy, 2));
  EXPECT_EQ(copy[0], 0x7c01);
  EXPECT_EQ(copy[1], 0xffff);
  // In place.
  ASSERT_TRUE(castElements(DType::Float16, nan, DType::Float16, nan, 2));
  ASSERT_TRUE(castElements(DType::Float32, nullptr, DType::Float16, nullptr, 0));
}

TEST(Values, CastErrors) {
  unsigned char in[16] = {}, out[16] = {};
  const std::pair<DType, DType> bad[] = {{DType::Int32, DType::Float32},
                                         {DType::Float32, DType::Int64},
                                         {DType::Complex64, DType::Float32},
                                         {DType::Float8E4M3FN, DType::BFloat16},
                                         {DType::Bool, DType::Float16}};
  for (auto [from, to] : bad) {
    Status status = castElements(from, in, to, out, 2);
    ASSERT_FALSE(status);
    EXPECT_NE(status.error().find(dcp::dtypeInfo(from).name), std::string::npos) << status.error();
    EXPECT_NE(status.error().find(dcp::dtypeInfo(to).name), std::string::npos) << status.error();
  }
}

//===----------------------------------------------------------------------===//
// The Python reference
//===----------------------------------------------------------------------===//

bool havePython() { return !std::string(FSDP_PYTHON3).empty(); }

/// Runs test_values.py with `args`; returns its exit code and stdout.
std::pair<int, std::string> runReference(const std::string &args) {
  return fsdp_test::runCapturingOutput(
      std::string(FSDP_PYTHON3) + " " + FSDP_VALUES_PYTHON + " " + args,
      ::testing::TempDir() + "fsdp-values-" + std::to_string(getpid()) + ".out");
}

std::string hexOf(const void *data, size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string text;
  for (size_t j = 0; j < size; ++j) {
    unsigned char byte = static_cast<const unsigned char *>(data)[j];
    text += digits[byte >> 4];
    text += digits[byte & 15];
  }
  return text;
}

TEST(Values, PythonReferenceDefault) {
  if (!havePython())
    GTEST_SKIP() << "python3 not found at configure time";
  // No arguments: the first 8 float32 values of "model.p0", seed 7.
  auto [code, output] = runReference("");
  ASSERT_EQ(code, 0) << output;
  float values[8];
  ASSERT_TRUE(fillTestValues(DType::Float32, fnv1a32("model.p0"), 0, 8, 7, values));
  std::istringstream lines(output);
  std::string line;
  int j = 0;
  for (; std::getline(lines, line); ++j) {
    ASSERT_LT(j, 8) << output;
    EXPECT_EQ(std::strtod(line.c_str(), nullptr), static_cast<double>(values[j])) << line;
  }
  EXPECT_EQ(j, 8) << output;
}

TEST(Values, PythonReferenceBytes) {
  if (!havePython())
    GTEST_SKIP() << "python3 not found at configure time";
  struct Case {
    std::string key; // sent as hex of its bytes
    uint32_t seed;
    uint64_t first;
    uint64_t count;
  };
  const Case cases[] = {
      {"model.p0", 7, 0, 300},
      {"layers.0.self_attn.q_proj.weight", 2147483647u, 123456789012ull, 200},
      {"\xc3\xa9t\xc3\xa9.\xe6\x9d\x83\xe9\x87\x8d", 1, 65500, 50},
      {"", 0, 2329428472224197ull - 100, 200}, // across the 64-bit wrap
  };
  std::string dtypes;
  for (DType dtype : kSupported)
    dtypes += std::string(dtypes.empty() ? "" : ",") + dcp::dtypeInfo(dtype).name;
  for (const Case &c : cases) {
    SCOPED_TRACE("key " + c.key + " first " + std::to_string(c.first));
    std::string want;
    for (DType dtype : kSupported) {
      std::vector<unsigned char> bytes(c.count * dcp::dtypeInfo(dtype).elementSize);
      ASSERT_TRUE(fillTestValues(dtype, fnv1a32(c.key), c.first, c.count, c.seed, bytes.data()));
      want += hexOf(bytes.data(), bytes.size()) + "\n";
    }
    auto [code, output] = runReference("--key-hex '" + hexOf(c.key.data(), c.key.size()) +
                                       "' --seed " + std::to_string(c.seed) + " --dtype " + dtypes +
                                       " --first " + std::to_string(c.first) + " --count " +
                                       std::to_string(c.count) + " --hex");
    ASSERT_EQ(code, 0) << output;
    // Line by line, so a failure names the dtype.
    std::istringstream got(output), expected(want);
    std::string gotLine, wantLine;
    for (DType dtype : kSupported) {
      std::getline(got, gotLine);
      std::getline(expected, wantLine);
      EXPECT_EQ(gotLine, wantLine) << dcp::dtypeInfo(dtype).name;
    }
    EXPECT_FALSE(std::getline(got, gotLine)) << "extra output: " << gotLine;
  }
}

TEST(Values, PythonReferenceRejectsBadArguments) {
  if (!havePython())
    GTEST_SKIP() << "python3 not found at configure time";
  EXPECT_NE(runReference("--dtype complex64").first, 0);
  EXPECT_NE(runReference("--seed -1").first, 0);
  EXPECT_NE(runReference("--seed 2147483648").first, 0);
}

} // namespace
