//===- Cast.cpp - Casts between floating dtypes ---------------------------===//
//
// castElements: one loop per (source, destination) pair, with ElementBits.h's
// conversions (the device's too) inlined.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/Cast.h"

#include "CastKernels.h"
#include "ElementBits.h"

#include <algorithm>
#include <cstring>
#if FSDP_CAST_HAS_X86_LEVELS
#include <immintrin.h>
#elif defined(__x86_64__)
#include <emmintrin.h>
#endif
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

// The casts a load makes of every main weight (f32 to a bf16 or f16 model
// weight) are built for AVX-512 and AVX2 beside the baseline, and the best
// the CPU runs is picked once: the baseline loop is compute-bound at about
// half of memcpy's speed, a tenth of a warm load. Picked by a function
// pointer, not GCC's target_clones: an ifunc resolver runs before a
// sanitizer's runtime is up and crashes instrumented builds at start-up.
#define FSDP_HALF_CAST_KERNEL(attributes, suffix)                                                \
  attributes void floatToHalf##suffix(const void *in, void *out, uint64_t count) {              \
    castLoop<float, uint16_t>(in, out, count, [](float v) { return toHalf(v); });                \
  }

void floatToBFloat16Baseline(const void *in, void *out, uint64_t count) {
  castLoop<float, uint16_t>(in, out, count, [](float v) { return toBFloat16(v); });
}

/// Copies `count` elements of `elementSize` bytes from `in` to `copy` and
/// casts each run of them from there by `castRun(from, out, count)` while
/// the run is in L1.
template <typename CastRun>
void copyThenCast(const void *in, void *copy, void *out, uint64_t count, uint64_t elementSize,
                  uint64_t outSize, CastRun castRun) {
  constexpr uint64_t kRunBytes = 16 << 10;
  uint64_t run = std::max<uint64_t>(1, kRunBytes / elementSize);
  const char *from = static_cast<const char *>(in);
  char *copied = static_cast<char *>(copy);
  char *to = static_cast<char *>(out);
  for (uint64_t j = 0; j < count; j += run) {
    uint64_t n = std::min(run, count - j);
    std::memcpy(copied + j * elementSize, from + j * elementSize, n * elementSize);
    castRun(copied + j * elementSize, to + j * outSize, n);
  }
}

void copyFloatToBFloat16Baseline(const void *in, void *copy, void *out, uint64_t count) {
  copyThenCast(in, copy, out, count, 4, 2, floatToBFloat16Baseline);
}
/// The streaming copy (copyBypassingCache) with `Vector`s: the destination's
/// unaligned head copied plainly, then whole 64-byte lines streamed, four
/// 4 KiB runs at a time, a line of each in turn, then the tail plainly. Four
/// runs keep four streams of reads in flight where one run's reads come one
/// after another. 1.87 GB a process, two at once, in 64 MiB calls (medians of
/// 8): AVX-512 0.18 s (0.22 s a line after another), AVX2 0.20 s (0.23),
/// SSE2 0.23 s (0.26); glibc's memcpy, which streams only above 192 MiB here,
/// 0.21 s for the 1.87 GB in one call.
#define FSDP_COPY_STREAMING(attributes, name, Vector, load, stream)                           \
  attributes void name(void *destination, const void *source, uint64_t bytes) {                \
    constexpr uint64_t kLine = 64, kRun = 4096, kRuns = 4;                                     \
    char *to = static_cast<char *>(destination);                                               \
    const char *from = static_cast<const char *>(source);                                      \
    if (!bytes)                                                                                \
      return; /* memcpy may not be handed a null pointer, even for no bytes */                 \
    uint64_t misaligned = reinterpret_cast<uintptr_t>(to) % kLine;                            \
    uint64_t at = std::min<uint64_t>(bytes, misaligned ? kLine - misaligned : 0);              \
    std::memcpy(to, from, at);                                                                 \
    for (; at + kRuns * kRun <= bytes; at += kRuns * kRun)                                     \
      for (uint64_t offset = 0; offset < kRun; offset += kLine)                                \
        for (uint64_t run = at + offset; run < at + kRuns * kRun; run += kRun)                 \
          for (uint64_t part = run; part < run + kLine; part += sizeof(Vector))                \
            stream(to + part, load(from + part));                                              \
    for (; at + kLine <= bytes; at += kLine)                                                   \
      for (uint64_t part = at; part < at + kLine; part += sizeof(Vector))                      \
        stream(to + part, load(from + part));                                                  \
    std::memcpy(to + at, from + at, bytes - at);                                               \
    _mm_sfence(); /* streaming stores are weakly ordered: visible before the reader reads */    \
  }

#if defined(__x86_64__)
// SSE2, which every x86-64 has.
inline __m128i load128(const char *at) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i *>(at));
}
inline void stream128(char *at, __m128i value) {
  _mm_stream_si128(reinterpret_cast<__m128i *>(at), value);
}
FSDP_COPY_STREAMING(, copyStreamingBaseline, __m128i, load128, stream128)
#else
void copyStreamingBaseline(void *destination, const void *source, uint64_t bytes) {
  if (bytes)
    std::memcpy(destination, source, bytes);
}
#endif

FSDP_HALF_CAST_KERNEL(, Baseline)
#if FSDP_CAST_HAS_X86_LEVELS
FSDP_HALF_CAST_KERNEL(__attribute__((target("arch=x86-64-v3"))), X86_64_V3)
FSDP_HALF_CAST_KERNEL(__attribute__((target("arch=x86-64-v4"))), X86_64_V4)

/// The copying casts' first elements, copied and cast one by one up to the
/// first `line`-aligned byte of the output (all of them if it is odd, and
/// so never aligned): the vector loop then streams whole lines. How many.
inline uint64_t castUpToStreamLine(const char *from, char *copied, char *to, uint64_t count,
                                   uint64_t line) {
  uintptr_t address = reinterpret_cast<uintptr_t>(to);
  uint64_t head =
      address % 2 ? count : std::min<uint64_t>(count, (line - address % line) % line / 2);
  std::memcpy(copied, from, 4 * head);
  castLoop<float, uint16_t>(from, to, head, [](float v) { return toBFloat16(v); });
  return head;
}

inline bool isStreamAligned(const char *at, uint64_t line) {
  return reinterpret_cast<uintptr_t>(at) % line == 0;
}

/// The copying cast with `Vector`s of `step / 2` f32: two loaded and stored
/// as the copy, packed into `step` bf16 that are streamed from the output's
/// first whole line of sizeof(Vector) bytes on (stored where it has none).
/// The copy is streamed too where its lines line up with the output's; then
/// four runs of the source go at once (623 MB a process, two at once, with
/// AVX-512: 0.081 s against 0.097 s a vector after another).
#define FSDP_COPY_CAST_STREAMING(attributes, name, Vector, step, load, store, stream, pack)    \
  attributes void name(const void *in, void *copy, void *out, uint64_t count) {                 \
    const char *from = static_cast<const char *>(in);                                          \
    char *copied = static_cast<char *>(copy);                                                  \
    char *to = static_cast<char *>(out);                                                       \
    uint64_t j = castUpToStreamLine(from, copied, to, count, sizeof(Vector));                  \
    bool streams = j < count && isStreamAligned(to + 2 * j, sizeof(Vector));                   \
    bool streamsCopy = j < count && isStreamAligned(copied + 4 * j, sizeof(Vector));           \
    /* Both streamed: four 4 KiB runs of the source at a time, as copyBypassingCache. */       \
    constexpr uint64_t kRunElements = 1024, kRuns = 4;                                         \
    if (streams && streamsCopy)                                                                \
      for (; j + kRuns * kRunElements <= count; j += kRuns * kRunElements)                     \
        for (uint64_t line = j; line < j + kRunElements; line += (step))                       \
          for (uint64_t at = line; at < line + kRuns * kRunElements; at += kRunElements) {     \
            Vector low = load(from + 4 * at), high = load(from + 4 * at + sizeof(Vector));     \
            stream(copied + 4 * at, low);                                                      \
            stream(copied + 4 * at + sizeof(Vector), high);                                    \
            stream(to + 2 * at, pack(low, high));                                              \
          }                                                                                    \
    for (; j + (step) <= count; j += (step)) {                                                 \
      Vector low = load(from + 4 * j), high = load(from + 4 * j + sizeof(Vector));             \
      if (streamsCopy) {                                                                       \
        stream(copied + 4 * j, low);                                                           \
        stream(copied + 4 * j + sizeof(Vector), high);                                         \
      } else {                                                                                 \
        store(copied + 4 * j, low);                                                            \
        store(copied + 4 * j + sizeof(Vector), high);                                          \
      }                                                                                        \
      if (streams)                                                                             \
        stream(to + 2 * j, pack(low, high));                                                   \
      else                                                                                     \
        store(to + 2 * j, pack(low, high));                                                    \
    }                                                                                          \
    if (streams || streamsCopy)                                                                \
      _mm_sfence(); /* streaming stores are weakly ordered: visible before the load returns */ \
    std::memcpy(copied + 4 * j, from + 4 * j, 4 * (count - j));                                \
    castLoop<float, uint16_t>(from + 4 * j, to + 2 * j, count - j,                             \
                              [](float v) { return toBFloat16(v); });                          \
  }

// f32 -> bf16 by hand, AVX2 (the v3 and v4 levels both): GCC's vectorisation
// of the scalar loop (its NaN test) cast 20 GB/s from L2 here, this 27-30
// (a load's refresh casts each block of main weights as it lands, so the
// cast's speed is the load's).
#define FSDP_AVX2 __attribute__((target("avx2")))
FSDP_AVX2 inline __m256i bfloat16Bits(__m256i bits) {
  // Round to nearest even, but a NaN is not rounded (that could carry into
  // its sign): its quiet bit is set instead, its top bits kept.
  __m256i isNan = _mm256_castps_si256(
      _mm256_cmp_ps(_mm256_castsi256_ps(bits), _mm256_castsi256_ps(bits), _CMP_UNORD_Q));
  __m256i lowestKept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i bias =
      _mm256_andnot_si256(isNan, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lowestKept));
  __m256i quiet = _mm256_and_si256(isNan, _mm256_set1_epi32(0x00400000));
  return _mm256_srli_epi32(_mm256_or_si256(_mm256_add_epi32(bits, bias), quiet), 16);
}

/// 16 f32 (two vectors of bits) as 16 bf16.
FSDP_AVX2 inline __m256i packBFloat16(__m256i low, __m256i high) {
  // Each lane's 16-bit values fit unsaturated; the pack interleaves the
  // 128-bit halves, which the permute puts back in order.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(bfloat16Bits(low), bfloat16Bits(high)),
                                  0xd8);
}

FSDP_AVX2 inline __m256i load256(const char *at) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(at));
}
FSDP_AVX2 inline void store256(char *at, __m256i value) {
  _mm256_storeu_si256(reinterpret_cast<__m256i *>(at), value);
}
FSDP_AVX2 inline void stream256(char *at, __m256i value) {
  _mm256_stream_si256(reinterpret_cast<__m256i *>(at), value);
}

FSDP_AVX2 void floatToBFloat16Avx2(const void *in, void *out, uint64_t count) {
  const char *from = static_cast<const char *>(in);
  char *to = static_cast<char *>(out);
  uint64_t j = 0;
  for (; j + 16 <= count; j += 16)
    store256(to + 2 * j, packBFloat16(load256(from + 4 * j), load256(from + 4 * j + 32)));
  castLoop<float, uint16_t>(from + 4 * j, to + 2 * j, count - j,
                            [](float v) { return toBFloat16(v); });
}

// The copy a load makes of a main weight from the page cache is bound by
// memory, the cast by arithmetic: in one loop the cast's arithmetic runs
// while the copy waits on memory. Measured (1.2 GB on 2 threads, with xxh3
// as a load hashes): 0.119 s against 0.142 s for a copy and then a cast,
// 0.113 s for the copy and hash alone.
//
// The bf16 output is written with streaming stores: the load does not read
// the model weights again, and a plain store first reads each line of them
// in from memory (3.74 GB warm load over 2 ranks: 9.6 GB/s against 9.0).
// So is the f32 copy: the load hashes each block from its source, which the
// copy leaves in cache, not from the copy.
FSDP_COPY_CAST_STREAMING(FSDP_AVX2, copyFloatToBFloat16Avx2, __m256i, 16, load256, store256,
                         stream256, packBFloat16)
FSDP_COPY_STREAMING(FSDP_AVX2, copyStreamingAvx2, __m256i, load256, stream256)
#undef FSDP_AVX2

// The same with AVX-512 (the v4 level): 16 f32 a vector, the NaN test a
// mask; still the integer rounding, not vcvtneps2bf16, which flushes
// denormals to zero where c10::BFloat16 keeps them.
#define FSDP_AVX512 __attribute__((target("avx512f,avx512bw")))
FSDP_AVX512 inline __m512i bfloat16Bits512(__m512i bits) {
  __m512 value = _mm512_castsi512_ps(bits);
  __mmask16 isNan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
  __m512i lowestKept = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded =
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lowestKept));
  __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000));
  return _mm512_srli_epi32(_mm512_mask_mov_epi32(rounded, isNan, quiet), 16);
}

/// 32 f32 (two vectors of bits) as 32 bf16, in order.
FSDP_AVX512 inline __m512i packBFloat16x32(__m512i low, __m512i high) {
  // The pack interleaves 128-bit lanes of the two; the permute restores order.
  __m512i packed = _mm512_packus_epi32(bfloat16Bits512(low), bfloat16Bits512(high));
  return _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed);
}

FSDP_AVX512 inline __m512i load512(const char *at) { return _mm512_loadu_si512(at); }
FSDP_AVX512 inline void store512(char *at, __m512i value) { _mm512_storeu_si512(at, value); }
FSDP_AVX512 inline void stream512(char *at, __m512i value) {
  _mm512_stream_si512(reinterpret_cast<__m512i *>(at), value);
}

FSDP_AVX512 void floatToBFloat16Avx512(const void *in, void *out, uint64_t count) {
  const char *from = static_cast<const char *>(in);
  char *to = static_cast<char *>(out);
  uint64_t j = 0;
  for (; j + 32 <= count; j += 32)
    store512(to + 2 * j, packBFloat16x32(load512(from + 4 * j), load512(from + 4 * j + 64)));
  castLoop<float, uint16_t>(from + 4 * j, to + 2 * j, count - j,
                            [](float v) { return toBFloat16(v); });
}

FSDP_COPY_CAST_STREAMING(FSDP_AVX512, copyFloatToBFloat16Avx512, __m512i, 32, load512,
                         store512, stream512, packBFloat16x32)
FSDP_COPY_STREAMING(FSDP_AVX512, copyStreamingAvx512, __m512i, load512, stream512)
#undef FSDP_AVX512
#undef FSDP_COPY_CAST_STREAMING
#endif
#undef FSDP_COPY_STREAMING
#undef FSDP_HALF_CAST_KERNEL

const FloatCastKernels &bestFloatCastKernels() {
  static const FloatCastKernels best = runnableFloatCastKernels().back();
  return best;
}

} // namespace

std::vector<FloatCastKernels> runnableFloatCastKernels() {
  std::vector<FloatCastKernels> kernels = {
      {"baseline", floatToBFloat16Baseline, floatToHalfBaseline, copyFloatToBFloat16Baseline,
       copyStreamingBaseline}};
#if FSDP_CAST_HAS_X86_LEVELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v3"))
    kernels.push_back(
        {"x86-64-v3", floatToBFloat16Avx2, floatToHalfX86_64_V3, copyFloatToBFloat16Avx2,
         copyStreamingAvx2});
  if (__builtin_cpu_supports("x86-64-v4"))
    kernels.push_back(
        {"x86-64-v4", floatToBFloat16Avx512, floatToHalfX86_64_V4, copyFloatToBFloat16Avx512,
         copyStreamingAvx512});
#endif
  return kernels;
}

void copyBypassingCache(void *destination, const void *source, uint64_t bytes) {
  bestFloatCastKernels().copyStreaming(destination, source, bytes);
}

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
    bestFloatCastKernels().toBFloat16(in, out, count);
    return Status::success();
  }
  if (from == dcp::DType::Float32 && to == dcp::DType::Float16) {
    bestFloatCastKernels().toHalf(in, out, count);
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

Status copyAndCastElements(dcp::DType from, const void *in, void *copy, dcp::DType to, void *out,
                           uint64_t count) {
  if (from == dcp::DType::Float32 && to == dcp::DType::BFloat16) {
    bestFloatCastKernels().copyToBFloat16(in, copy, out, count);
    return Status::success();
  }
  if (!isCastable(from) || !isCastable(to))
    return castElements(from, in, to, out, count); // its error, nothing copied
  Status status = Status::success();
  copyThenCast(in, copy, out, count, dcp::dtypeInfo(from).elementSize,
               dcp::dtypeInfo(to).elementSize, [&](const void *run, void *into, uint64_t n) {
                 if (status)
                   status = castElements(from, run, to, into, n);
               });
  return status;
}

} // namespace runtime
} // namespace fsdp
