//===- Cast.cpp - Casts between floating dtypes ---------------------------===//
//
// castElements: one loop per (source, destination) pair, with ElementBits.h's
// conversions (the device's too) inlined.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/Cast.h"

#include "ElementBits.h"

#include <cstring>
#include <string>

namespace fsdp {
namespace runtime {

namespace {

// The float-typed faces of ElementBits.h's bit functions.
inline uint16_t toBFloat16(float value) {
  return elementbits::toBFloat16(elementbits::floatBits(value));
}
inline uint16_t toHalf(float value) { return elementbits::toHalf(elementbits::floatBits(value)); }
inline float fromBFloat16(uint16_t value) {
  return elementbits::bitsFloat(elementbits::fromBFloat16(value));
}
inline float fromHalf(uint16_t value) {
  return elementbits::bitsFloat(elementbits::fromHalf(value));
}

bool isCastable(dcp::DType dtype) {
  return dtype == dcp::DType::Float64 || dtype == dcp::DType::Float32 ||
         dtype == dcp::DType::BFloat16 || dtype == dcp::DType::Float16;
}

template <typename From, typename To, typename Convert>
void castLoop(const void *in, void *out, uint64_t count, Convert convert) {
  const unsigned char *src = static_cast<const unsigned char *>(in);
  unsigned char *dst = static_cast<unsigned char *>(out);
  for (uint64_t j = 0; j < count; ++j) {
    From value;
    std::memcpy(&value, src + j * sizeof(From), sizeof(From));
    To result = convert(value);
    std::memcpy(dst + j * sizeof(To), &result, sizeof(To));
  }
}

/// Loops from `from` to a fixed destination `To` through `convert(Wide)`;
/// reading as `Wide` is exact except f64 -> f32 (rounded to nearest even).
template <typename Wide, typename To, typename Convert>
bool castFrom(dcp::DType from, const void *in, void *out, uint64_t count, Convert convert) {
  using dcp::DType;
  switch (from) {
  case DType::Float64:
    castLoop<double, To>(in, out, count, [&](double v) { return convert(static_cast<Wide>(v)); });
    return true;
  case DType::Float32:
    castLoop<float, To>(in, out, count, [&](float v) { return convert(static_cast<Wide>(v)); });
    return true;
  case DType::BFloat16:
    castLoop<uint16_t, To>(in, out, count,
                           [&](uint16_t v) { return convert(static_cast<Wide>(fromBFloat16(v))); });
    return true;
  case DType::Float16:
    castLoop<uint16_t, To>(in, out, count,
                           [&](uint16_t v) { return convert(static_cast<Wide>(fromHalf(v))); });
    return true;
  default:
    return false;
  }
}

/// The casts a load makes of every main weight (f32 to a bf16 or f16 model
/// weight), built for AVX-512 and AVX2 beside the baseline and picked at
/// load time: the baseline loop is compute-bound at about half of memcpy's
/// speed on this project's machines, and it is a tenth of a warm load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FSDP_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FSDP_VECTOR_CLONES
#endif

FSDP_VECTOR_CLONES void castFloatToBFloat16(const void *in, void *out, uint64_t count) {
  castLoop<float, uint16_t>(in, out, count, [](float v) { return toBFloat16(v); });
}

FSDP_VECTOR_CLONES void castFloatToHalf(const void *in, void *out, uint64_t count) {
  castLoop<float, uint16_t>(in, out, count, [](float v) { return toHalf(v); });
}

} // namespace

uint16_t floatToBFloat16(float value) { return toBFloat16(value); }
uint16_t floatToHalf(float value) { return toHalf(value); }
float bfloat16ToFloat(uint16_t value) { return fromBFloat16(value); }
float halfToFloat(uint16_t value) { return fromHalf(value); }

Status castElements(dcp::DType from, const void *in, dcp::DType to, void *out, uint64_t count) {
  if (from == to) {
    // Any dtype: a copy is the identity cast. memmove: in == out is fine.
    if (count)
      std::memmove(out, in, count * dcp::dtypeInfo(from).elementSize);
    return Status::success();
  }
  if (!isCastable(from) || !isCastable(to))
    return makeError("cannot cast " + dcp::dtypeNameOrCode(from) + " to " +
                     dcp::dtypeNameOrCode(to) +
                     ": only float64, float32, bfloat16 and float16 casts are supported");
  // Wider sources go through f32 for the 16-bit targets, as c10::BFloat16 and
  // c10::Half (constructed from float) do for a double tensor's .to().
  if (from == dcp::DType::Float32 && to == dcp::DType::BFloat16) {
    castFloatToBFloat16(in, out, count);
    return Status::success();
  }
  if (from == dcp::DType::Float32 && to == dcp::DType::Float16) {
    castFloatToHalf(in, out, count);
    return Status::success();
  }
  bool ok = false;
  switch (to) {
  case dcp::DType::Float64:
    ok = castFrom<double, double>(from, in, out, count, [](double v) { return v; });
    break;
  case dcp::DType::Float32:
    ok = castFrom<float, float>(from, in, out, count, [](float v) { return v; });
    break;
  case dcp::DType::BFloat16:
    ok = castFrom<float, uint16_t>(from, in, out, count, [](float v) { return toBFloat16(v); });
    break;
  case dcp::DType::Float16:
    ok = castFrom<float, uint16_t>(from, in, out, count, [](float v) { return toHalf(v); });
    break;
  default:
    break;
  }
  if (!ok)
    return makeError("cannot cast " + dcp::dtypeNameOrCode(from) + " to " +
                     dcp::dtypeNameOrCode(to));
  return Status::success();
}

} // namespace runtime
} // namespace fsdp
