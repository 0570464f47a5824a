//===- SlowFloat.h - Slow references for bf16 and f16 -----------*- C++ -*-===//
//
// f32 -> bf16/f16 rounding by binary search over the target format's values
// in double arithmetic (no bit tricks), so the runtime's casts
// (runtime/ElementBits.h) are checked against something written another way.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_UNITTESTS_RUNTIME_SLOWFLOAT_H
#define FSDP_UNITTESTS_RUNTIME_SLOWFLOAT_H

#include <cmath>
#include <cstdint>

namespace fsdp_test {

/// The value of a binary16 magnitude code (0 .. 0x7c00), 0x7c00 counting as
/// 2^16: the next power of two past the largest finite value, which is what
/// IEEE rounding compares against for overflow.
inline double halfMagnitude(uint32_t code) {
  uint32_t exponent = code >> 10, mantissa = code & 0x3ff;
  if (exponent == 0)
    return std::ldexp(static_cast<double>(mantissa), -24);
  return std::ldexp(static_cast<double>(1024 + mantissa), static_cast<int>(exponent) - 25);
}

/// bfloat16 magnitude code (0 .. 0x7f80), 0x7f80 counting as 2^128.
inline double bfloat16Magnitude(uint32_t code) {
  uint32_t exponent = code >> 7, mantissa = code & 0x7f;
  if (exponent == 0)
    return std::ldexp(static_cast<double>(mantissa), -133);
  return std::ldexp(static_cast<double>(128 + mantissa), static_cast<int>(exponent) - 134);
}

/// Rounds |x| to nearest even among the codes 0 .. infCode of a format by
/// binary search over their values; the sign is put back as the top bit.
/// Midpoints of neighbours are exact in double, so the comparisons are too.
inline uint16_t roundSlow(float x, double (*magnitude)(uint32_t), uint32_t infCode) {
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double a = std::fabs(static_cast<double>(x));
  if (std::isinf(x) || a >= magnitude(infCode))
    return static_cast<uint16_t>(sign | infCode);
  uint32_t lo = 0, hi = infCode; // magnitude(lo) <= a < magnitude(hi)
  while (hi - lo > 1) {
    uint32_t mid = (lo + hi) / 2;
    if (magnitude(mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  double midpoint = (magnitude(lo) + magnitude(hi)) / 2;
  uint32_t code;
  if (a < midpoint)
    code = lo;
  else if (a > midpoint)
    code = hi;
  else
    code = (lo & 1) ? hi : lo;
  return static_cast<uint16_t>(sign | code);
}

inline uint16_t halfSlow(float x) { return roundSlow(x, halfMagnitude, 0x7c00); }
inline uint16_t bfloat16Slow(float x) { return roundSlow(x, bfloat16Magnitude, 0x7f80); }

} // namespace fsdp_test

#endif // FSDP_UNITTESTS_RUNTIME_SLOWFLOAT_H
