//===- Values.cpp - Deterministic test values -----------------------------===//
//
// The test value generator walks the residue r = S mod 65521 of
// S = i * 7919 + SEED * 104729 + fnv1a32(k) incrementally (r += 7919, minus
// 65521 when it passes), 16 residues side by side so that the loops
// vectorize: an add, a compare and a conversion per element, one modulo per
// run. S is a uint64 sum that
// wraps (docs/TestValues.md): a run is cut where S + 7919 would pass 2^64 and
// the residue is recomputed there, so even absurd indices follow the formula.
//
// Each dtype instantiates the loops with its own inlined conversion: no
// per-element dispatch, no allocation.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/Values.h"
#include "fsdp/Runtime/Cast.h"

#include "ElementBits.h"

#include <charconv>
#include <cstring>
#include <limits>
#include <string>

namespace fsdp {
namespace runtime {

namespace {

// The formula's constants, shared with the device's fill and check.
constexpr uint64_t kIndexMul = elementbits::kTestValueIndexMul;
constexpr uint64_t kSeedMul = elementbits::kTestValueSeedMul;
constexpr uint32_t kModulus = elementbits::kTestValueModulus;
constexpr int32_t kBias = elementbits::kTestValueBias;

using elementbits::floatBits;

/// toBFloat16 for values that are not NaN (test values): branch-free.
inline uint16_t toBFloat16NotNaN(float value) {
  uint32_t bits = floatBits(value);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

/// toHalf for 0 and values whose magnitude is in f16's normal range (every
/// test value: 1/256 <= |N / 256| < 128): branch-free.
inline uint16_t toHalfNormalOrZero(float value) {
  uint32_t bits = floatBits(value);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t mag = bits & 0x7fffffffu;
  uint32_t rebased = mag - 0x38000000u;
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  uint32_t half = mag ? rebased >> 13 : 0u;
  return static_cast<uint16_t>(sign | half);
}

/// S mod 65521 for element `index`, with S wrapped to 64 bits.
inline uint64_t wrappedSum(uint32_t keyHash, uint64_t index, uint32_t seed) {
  return index * kIndexMul + static_cast<uint64_t>(seed) * kSeedMul + keyHash;
}

/// Calls run(residue, offset, n) for consecutive pieces of [first, first +
/// count) in which S does not wrap, so the residue may be stepped by 7919.
template <typename Run>
inline bool forEachRun(uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed, Run run) {
  uint64_t offset = 0;
  while (count) {
    uint64_t sum = wrappedSum(keyHash, first, seed);
    uint64_t room = (std::numeric_limits<uint64_t>::max() - sum) / kIndexMul + 1;
    uint64_t n = count < room ? count : room;
    if (!run(static_cast<uint32_t>(sum % kModulus), offset, n))
      return false;
    first += n;
    offset += n;
    count -= n;
  }
  return true;
}

inline uint32_t step(uint32_t residue) {
  residue += static_cast<uint32_t>(kIndexMul);
  return residue >= kModulus ? residue - kModulus : residue;
}

/// The generator runs kLanes residues side by side (elements j, j + 1, ...,
/// each stepping kLanes elements at a time), so the per-element work has no
/// serial dependency and the compiler can vectorize it.
constexpr unsigned kLanes = 16;
constexpr uint32_t kLaneStride = static_cast<uint32_t>((kLanes * kIndexMul) % kModulus);

struct Lanes {
  uint32_t residue[kLanes];
  /// Starts at `residue`; returns the residue kLanes elements on.
  explicit Lanes(uint32_t &next) {
    for (unsigned k = 0; k < kLanes; ++k) {
      residue[k] = next;
      next = step(next);
    }
  }
  void advance() {
    for (unsigned k = 0; k < kLanes; ++k) {
      uint32_t value = residue[k] + kLaneStride;
      residue[k] = value >= kModulus ? value - kModulus : value;
    }
  }
  template <typename T, typename Make> void make(T (&block)[kLanes], Make make) const {
    for (unsigned k = 0; k < kLanes; ++k)
      block[k] = make(static_cast<int32_t>(residue[k]) - kBias);
  }
};

template <typename T, typename Make>
void fillRun(uint32_t residue, uint64_t n, unsigned char *out, Make make) {
  uint64_t j = 0;
  if (n >= kLanes) {
    uint32_t next = residue;
    Lanes lanes(next);
    for (; j + kLanes <= n; j += kLanes) {
      T block[kLanes];
      lanes.make(block, make);
      std::memcpy(out + j * sizeof(T), block, sizeof block);
      lanes.advance();
    }
    residue = lanes.residue[0];
  }
  for (; j < n; ++j) {
    T value = make(static_cast<int32_t>(residue) - kBias);
    std::memcpy(out + j * sizeof(T), &value, sizeof(T));
    residue = step(residue);
  }
}

/// The offset of the first element whose bytes differ, or n.
template <typename T, typename Make>
uint64_t checkRun(uint32_t residue, uint64_t n, const unsigned char *in, Make make) {
  uint64_t j = 0;
  if (n >= kLanes) {
    uint32_t next = residue;
    Lanes lanes(next);
    for (; j + kLanes <= n; j += kLanes) {
      T block[kLanes];
      lanes.make(block, make);
      if (std::memcmp(in + j * sizeof(T), block, sizeof block) != 0)
        break; // the element-wise loop below finds which one
      lanes.advance();
    }
    residue = lanes.residue[0];
  }
  for (; j < n; ++j) {
    T value = make(static_cast<int32_t>(residue) - kBias);
    if (std::memcmp(&value, in + j * sizeof(T), sizeof(T)) != 0)
      return j;
    residue = step(residue);
  }
  return n;
}

template <typename T> std::string numberText(T value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

/// Floats print as the shortest double that round-trips: the exact decimal
/// of every test value (-69.0390625, not the f32-shortest -69.03906), as
/// Python prints it.
std::string floatText(float value) { return numberText(static_cast<double>(value)); }

template <typename T> struct Tag { using type = T; };

/// Calls visit(Tag<Storage>, make, text) for a dtype with test values, where
/// make(N) is the stored element and text(element) prints it; returns false
/// for dtypes without them.
template <typename Visit> bool visitDType(dcp::DType dtype, Visit visit) {
  using dcp::DType;
  switch (dtype) {
  case DType::Float64:
    visit(
        Tag<double>{}, [](int32_t n) { return static_cast<double>(n) * (1.0 / 256); },
        [](double v) { return numberText(v); });
    return true;
  case DType::Float32:
    visit(
        Tag<float>{}, [](int32_t n) { return static_cast<float>(n) * (1.0f / 256); },
        [](float v) { return floatText(v); });
    return true;
  case DType::BFloat16:
    visit(
        Tag<uint16_t>{},
        [](int32_t n) { return toBFloat16NotNaN(static_cast<float>(n) * (1.0f / 256)); },
        [](uint16_t v) { return floatText(bfloat16ToFloat(v)); });
    return true;
  case DType::Float16:
    visit(
        Tag<uint16_t>{},
        [](int32_t n) { return toHalfNormalOrZero(static_cast<float>(n) * (1.0f / 256)); },
        [](uint16_t v) { return floatText(halfToFloat(v)); });
    return true;
  case DType::Int64:
    visit(
        Tag<int64_t>{}, [](int32_t n) { return static_cast<int64_t>(n); },
        [](int64_t v) { return numberText(v); });
    return true;
  case DType::Int32:
    visit(
        Tag<int32_t>{}, [](int32_t n) { return n; }, [](int32_t v) { return numberText(v); });
    return true;
  case DType::Int16:
    visit(
        Tag<int16_t>{}, [](int32_t n) { return static_cast<int16_t>(n); },
        [](int16_t v) { return numberText(v); });
    return true;
  case DType::Int8: // two's complement wrap (as torch's int -> int8 cast)
    visit(
        Tag<int8_t>{}, [](int32_t n) { return static_cast<int8_t>(static_cast<uint8_t>(n)); },
        [](int8_t v) { return numberText(static_cast<int>(v)); });
    return true;
  case DType::UInt8:
    visit(
        Tag<uint8_t>{}, [](int32_t n) { return static_cast<uint8_t>(n); },
        [](uint8_t v) { return numberText(static_cast<unsigned>(v)); });
    return true;
  case DType::UInt16:
    visit(
        Tag<uint16_t>{}, [](int32_t n) { return static_cast<uint16_t>(n); },
        [](uint16_t v) { return numberText(static_cast<unsigned>(v)); });
    return true;
  case DType::UInt32:
    visit(
        Tag<uint32_t>{}, [](int32_t n) { return static_cast<uint32_t>(n); },
        [](uint32_t v) { return numberText(v); });
    return true;
  case DType::UInt64:
    visit(
        Tag<uint64_t>{}, [](int32_t n) { return static_cast<uint64_t>(static_cast<int64_t>(n)); },
        [](uint64_t v) { return numberText(v); });
    return true;
  case DType::Bool:
    visit(
        Tag<uint8_t>{}, [](int32_t n) { return static_cast<uint8_t>(n % 2 != 0); },
        [](uint8_t v) { return numberText(static_cast<unsigned>(v)); });
    return true;
  default:
    return false;
  }
}

Error noTestValues(dcp::DType dtype) {
  return makeError("no test values are defined for dtype " + dcp::dtypeNameOrCode(dtype));
}

} // namespace

uint32_t fnv1a32(std::string_view text) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 16777619u;
  }
  return hash;
}

int32_t testValue(uint32_t keyHash, uint64_t elementIndex, uint32_t seed) {
  return static_cast<int32_t>(wrappedSum(keyHash, elementIndex, seed) % kModulus) - kBias;
}

Status fillTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement, uint64_t count,
                      uint32_t seed, void *out) {
  unsigned char *bytes = static_cast<unsigned char *>(out);
  bool known = visitDType(dtype, [&](auto tag, auto make, auto) {
    using T = typename decltype(tag)::type;
    forEachRun(keyHash, firstElement, count, seed,
               [&](uint32_t residue, uint64_t offset, uint64_t n) {
                 fillRun<T>(residue, n, bytes + offset * sizeof(T), make);
                 return true;
               });
  });
  if (!known)
    return noTestValues(dtype);
  return Status::success();
}

Status checkTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement, uint64_t count,
                       uint32_t seed, const void *data) {
  const unsigned char *bytes = static_cast<const unsigned char *>(data);
  std::string mismatch;
  bool known = visitDType(dtype, [&](auto tag, auto make, auto text) {
    using T = typename decltype(tag)::type;
    forEachRun(keyHash, firstElement, count, seed,
               [&](uint32_t residue, uint64_t offset, uint64_t n) {
                 const unsigned char *run = bytes + offset * sizeof(T);
                 uint64_t at = checkRun<T>(residue, n, run, make);
                 if (at == n)
                   return true;
                 uint64_t index = firstElement + offset + at;
                 T found;
                 std::memcpy(&found, run + at * sizeof(T), sizeof(T));
                 T expected = make(testValue(keyHash, index, seed));
                 mismatch = "element " + std::to_string(index) + ": found " + text(found) +
                            ", expected " + text(expected);
                 return false;
               });
  });
  if (!known)
    return noTestValues(dtype);
  if (!mismatch.empty())
    return makeError(std::move(mismatch));
  return Status::success();
}

} // namespace runtime
} // namespace fsdp
