//===- ElementBits.h - Element casts and test values ------------*- C++ -*-===//
//
// The one definition of what a cast or a test value computes per element,
// as plain integer arithmetic on bit patterns: f32 -> bf16/f16 (round to
// nearest even, quiet NaNs, f16 subnormals), bf16/f16 -> f32, and the test
// values of docs/TestValues.md. runtime/Cast.cpp (every load's cast on the
// host) and cuda/Kernels.cu (the same casts on the device) both compile this
// text, so host and device round alike by construction; the unit tests check
// it against slow references that search the target format's values.
//
// Plain C++ when not compiled by nvcc: no CUDA header needed.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_ELEMENTBITS_H
#define FSDP_RUNTIME_ELEMENTBITS_H

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FSDP_HD __host__ __device__ __forceinline__
#else
#define FSDP_HD inline
#endif

namespace fsdp {
namespace runtime {
namespace elementbits {

/// The element types the kernels know (a dcp::DType's kernel twin: the
/// runtime maps one to the other; Kernels.cu stays free of the format's
/// headers).
enum class ValueType : int {
  Float64,
  Float32,
  BFloat16,
  Float16,
  Int64,
  Int32,
  Int16,
  Int8,
  UInt8,
  UInt16,
  UInt32,
  UInt64,
  Bool,
};

FSDP_HD uint32_t floatBits(float value) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__float_as_uint(value));
#else
  uint32_t out;
  std::memcpy(&out, &value, sizeof out);
  return out;
#endif
}

FSDP_HD float bitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
#endif
}

FSDP_HD uint64_t doubleBits(double value) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(value));
#else
  uint64_t out;
  std::memcpy(&out, &value, sizeof out);
  return out;
#endif
}

FSDP_HD double bitsDouble(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
#endif
}

/// f32 bits -> bf16, round to nearest even; NaN keeps its sign and top
/// payload and becomes quiet; overflow carries up to infinity.
FSDP_HD uint16_t toBFloat16(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

/// f32 bits -> f16, round to nearest even (subnormals too); NaN keeps the
/// top 10 payload bits and becomes quiet; >= 65520 goes to infinity.
FSDP_HD uint16_t toHalf(uint32_t bits) {
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));
  if (mag >= 0x477ff000u)
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (mag >= 0x38800000u) {
    uint32_t rebased = mag - 0x38000000u;
    rebased += 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rebased >> 13));
  }
  if (mag <= 0x33000000u)
    return sign;
  uint32_t exponent = mag >> 23; // 102..112
  uint32_t mantissa = (mag & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - exponent; // 14..24
  uint32_t units = mantissa >> shift;
  uint32_t rest = mantissa & ((1u << shift) - 1);
  uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (units & 1u)))
    ++units;
  return static_cast<uint16_t>(sign | units);
}

/// bf16 -> f32 bits (exact).
FSDP_HD uint32_t fromBFloat16(uint16_t value) { return static_cast<uint32_t>(value) << 16; }

/// f16 -> f32 bits (exact; NaN payloads kept), in integer arithmetic only
/// (no float multiply, so no flush-to-zero mode can touch subnormals).
FSDP_HD uint32_t fromHalf(uint16_t value) {
  uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0) {
    if (mantissa == 0)
      return sign;
    // mantissa * 2^-24: normalize so that bit 10 is the leading one.
    uint32_t biased = 113;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      --biased;
    }
    return sign | (biased << 23) | ((mantissa & 0x3ffu) << 13);
  }
  if (exponent == 0x1f)
    return sign | 0x7f800000u | (mantissa << 13);
  return sign | ((exponent + 112) << 23) | (mantissa << 13);
}

/// The test value formula (Values.h): S = index * 7919 + seed * 104729 +
/// keyHash wrapped to 64 bits, N = (S mod 65521) - 32760.
constexpr uint64_t kTestValueIndexMul = 7919;
constexpr uint64_t kTestValueSeedMul = 104729;
constexpr uint32_t kTestValueModulus = 65521;
constexpr int32_t kTestValueBias = 32760;

/// N for element `index`.
FSDP_HD int32_t testValue(uint32_t keyHash, uint64_t index, uint32_t seed) {
  uint64_t sum = index * kTestValueIndexMul + static_cast<uint64_t>(seed) * kTestValueSeedMul +
                 keyHash;
  return static_cast<int32_t>(sum % kTestValueModulus) - kTestValueBias;
}

/// The stored element of test value `n` for each type (the bits of floats),
/// as Values.cpp's visitDType makes it.
template <ValueType V> struct TestElement;
template <> struct TestElement<ValueType::Float64> {
  using type = uint64_t;
  static FSDP_HD type make(int32_t n) { return doubleBits(static_cast<double>(n) * (1.0 / 256)); }
};
template <> struct TestElement<ValueType::Float32> {
  using type = uint32_t;
  static FSDP_HD type make(int32_t n) { return floatBits(static_cast<float>(n) * (1.0f / 256)); }
};
template <> struct TestElement<ValueType::BFloat16> {
  using type = uint16_t;
  static FSDP_HD type make(int32_t n) {
    return toBFloat16(floatBits(static_cast<float>(n) * (1.0f / 256)));
  }
};
template <> struct TestElement<ValueType::Float16> {
  using type = uint16_t;
  static FSDP_HD type make(int32_t n) {
    return toHalf(floatBits(static_cast<float>(n) * (1.0f / 256)));
  }
};
template <> struct TestElement<ValueType::Int64> {
  using type = uint64_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint64_t>(static_cast<int64_t>(n)); }
};
template <> struct TestElement<ValueType::Int32> {
  using type = uint32_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint32_t>(n); }
};
template <> struct TestElement<ValueType::Int16> {
  using type = uint16_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint16_t>(static_cast<uint32_t>(n)); }
};
template <> struct TestElement<ValueType::Int8> {
  using type = uint8_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint8_t>(static_cast<uint32_t>(n)); }
};
template <> struct TestElement<ValueType::UInt8> {
  using type = uint8_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint8_t>(static_cast<uint32_t>(n)); }
};
template <> struct TestElement<ValueType::UInt16> {
  using type = uint16_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint16_t>(static_cast<uint32_t>(n)); }
};
template <> struct TestElement<ValueType::UInt32> {
  using type = uint32_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint32_t>(n); }
};
template <> struct TestElement<ValueType::UInt64> {
  using type = uint64_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint64_t>(static_cast<int64_t>(n)); }
};
template <> struct TestElement<ValueType::Bool> {
  using type = uint8_t;
  static FSDP_HD type make(int32_t n) { return static_cast<uint8_t>(n % 2 != 0); }
};

} // namespace elementbits
} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_ELEMENTBITS_H
