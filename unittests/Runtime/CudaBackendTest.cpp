//===- CudaBackendTest.cpp - The CUDA backend, its kernels and NCCL -------===//
//
// Three kinds of test:
//   - the kernels' element functions (runtime/ElementBits.h, which the
//     host's casts compile too), here on the host: casts over millions of
//     f32 patterns (every exponent, NaNs, infinities, subnormals, ties)
//     against slow references, and the test values of every dtype against
//     runtime/Values.cpp's vectorized loops. They run in every build, GPU or
//     not;
//   - what a build says without a GPU: no CUDA in the build, or CUDA but no
//     device (one line naming CUDA, no abort, no hang);
//   - the backend on a GPU (skipped, with the reason, without one).
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/CudaBackend.h"
#include "fsdp/Runtime/Cast.h"
#include "fsdp/Runtime/DataPlane.h"
#include "fsdp/Runtime/Values.h"

#include "../../runtime/ElementBits.h"
#include "../TestSupport.h"
#include "SlowFloat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace fsdp;
using namespace fsdp::runtime;
using dcp::DType;
namespace bits = fsdp::runtime::elementbits;

namespace {

using fsdp_test::bitsOf;
using fsdp_test::floatOf;

/// f32 patterns that exercise the casts: every high half (sign, exponent,
/// top mantissa bits: NaNs, infinities, subnormals, all exponents) with the
/// low halves around the bf16 tie and the f16 ties, and random patterns.
std::vector<uint32_t> castPatterns(size_t randoms) {
  static const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                                  0x2001, 0x3000, 0x5000, 0x7fff, 0x8000, 0x8001, 0x9000,
                                  0xa000, 0xbfff, 0xc000, 0xe000, 0xf000, 0xffff};
  std::vector<uint32_t> patterns;
  patterns.reserve(65536 * std::size(lows) + randoms);
  for (uint32_t high = 0; high < 65536; ++high)
    for (uint32_t low : lows)
      patterns.push_back(high << 16 | low);
  std::mt19937_64 random(20240611);
  for (size_t i = 0; i < randoms; ++i)
    patterns.push_back(static_cast<uint32_t>(random()));
  return patterns;
}

bool kernelType(DType dtype, bits::ValueType &type) {
  switch (dtype) {
#define FSDP_MAP(D, V)                                                                             \
  case DType::D:                                                                                   \
    type = bits::ValueType::V;                                                                     \
    return true;
    FSDP_MAP(Float64, Float64)
    FSDP_MAP(Float32, Float32)
    FSDP_MAP(BFloat16, BFloat16)
    FSDP_MAP(Float16, Float16)
    FSDP_MAP(Int64, Int64)
    FSDP_MAP(Int32, Int32)
    FSDP_MAP(Int16, Int16)
    FSDP_MAP(Int8, Int8)
    FSDP_MAP(UInt8, UInt8)
    FSDP_MAP(UInt16, UInt16)
    FSDP_MAP(UInt32, UInt32)
    FSDP_MAP(UInt64, UInt64)
    FSDP_MAP(Bool, Bool)
#undef FSDP_MAP
  default:
    return false;
  }
}

const DType kTestValueDTypes[] = {DType::Float64, DType::Float32, DType::BFloat16, DType::Float16,
                                  DType::Int64,   DType::Int32,   DType::Int16,    DType::Int8,
                                  DType::UInt8,   DType::UInt16,  DType::UInt32,   DType::UInt64,
                                  DType::Bool};

/// The device function's test values of elements [first, +count), as bytes.
template <bits::ValueType V>
std::string deviceTestValues(uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed) {
  using T = typename bits::TestElement<V>::type;
  std::string out(count * sizeof(T), '\0');
  for (uint64_t i = 0; i < count; ++i) {
    T value = bits::TestElement<V>::make(bits::testValue(keyHash, first + i, seed));
    std::memcpy(&out[i * sizeof(T)], &value, sizeof(T));
  }
  return out;
}

std::string deviceTestValues(bits::ValueType type, uint32_t keyHash, uint64_t first,
                             uint64_t count, uint32_t seed) {
  switch (type) {
#define FSDP_CASE(V)                                                                               \
  case bits::ValueType::V:                                                                         \
    return deviceTestValues<bits::ValueType::V>(keyHash, first, count, seed);
    FSDP_CASE(Float64)
    FSDP_CASE(Float32)
    FSDP_CASE(BFloat16)
    FSDP_CASE(Float16)
    FSDP_CASE(Int64)
    FSDP_CASE(Int32)
    FSDP_CASE(Int16)
    FSDP_CASE(Int8)
    FSDP_CASE(UInt8)
    FSDP_CASE(UInt16)
    FSDP_CASE(UInt32)
    FSDP_CASE(UInt64)
    FSDP_CASE(Bool)
#undef FSDP_CASE
  }
  return {};
}

struct ValueCase {
  uint32_t keyHash;
  uint64_t first;
  uint64_t count;
  uint32_t seed;
};
const ValueCase kValueCases[] = {
    {0, 0, 1000, 0},
    {fnv1a32("model.layers.0.mlp.w1.weight"), 12345, 70000, 7},
    {0xffffffffu, 1ull << 40, 5000, 0xffffffffu},
    // Across the 64-bit wrap of S = i * 7919 + ...
    {fnv1a32("wrap"), ~0ull / 7919 - 300, 1000, 3},
    {0x9e3779b9u, ~0ull - 700, 700, 11},
};

// --- The kernels' arithmetic, compiled for the host ---------------------------

/// Whether a 16-bit cast of f32 `pattern` is right: the slow reference's
/// code, or for a NaN a quiet NaN of the same sign.
bool roundsRight(uint32_t pattern, uint16_t got, uint16_t (*slow)(float), uint16_t quietBit,
                 uint16_t infBits) {
  float value = floatOf(pattern);
  if (std::isnan(value))
    return (got & infBits) == infBits && (got & quietBit) && (got >> 15) == (pattern >> 31);
  return got == slow(value);
}

TEST(CudaKernelBits, CastsMatchTheSlowReference) {
  std::vector<uint32_t> patterns = castPatterns(2'000'000);
  size_t bad = 0;
  for (uint32_t pattern : patterns) {
    uint16_t bf = bits::toBFloat16(pattern), half = bits::toHalf(pattern);
    if (!roundsRight(pattern, bf, fsdp_test::bfloat16Slow, 0x0040, 0x7f80) ||
        !roundsRight(pattern, half, fsdp_test::halfSlow, 0x0200, 0x7c00)) {
      if (++bad <= 5)
        ADD_FAILURE() << std::hex << "f32 0x" << pattern << ": bf16 0x" << bf << " f16 0x" << half
                      << ", reference bf16 0x" << fsdp_test::bfloat16Slow(floatOf(pattern))
                      << " f16 0x" << fsdp_test::halfSlow(floatOf(pattern));
    }
  }
  EXPECT_EQ(bad, 0u) << "of " << patterns.size() << " patterns";
}

// All 2^32 patterns: FSDP_CUDA_FULL_CAST_SWEEP=1 (several minutes).
TEST(CudaKernelBits, CastsMatchTheSlowReferenceOverEveryPattern) {
  if (!std::getenv("FSDP_CUDA_FULL_CAST_SWEEP"))
    GTEST_SKIP() << "set FSDP_CUDA_FULL_CAST_SWEEP=1 to compare all 2^32 f32 patterns";
  uint64_t bad = 0;
  for (uint64_t p = 0; p <= 0xffffffffull; ++p) {
    uint32_t pattern = static_cast<uint32_t>(p);
    bad += !roundsRight(pattern, bits::toBFloat16(pattern), fsdp_test::bfloat16Slow, 0x0040,
                        0x7f80);
    bad += !roundsRight(pattern, bits::toHalf(pattern), fsdp_test::halfSlow, 0x0200, 0x7c00);
  }
  EXPECT_EQ(bad, 0u);
}

TEST(CudaKernelBits, WideningIsExact) {
  for (uint32_t v = 0; v < 65536; ++v) {
    auto value = static_cast<uint16_t>(v);
    ASSERT_EQ(bits::fromBFloat16(value), v << 16) << std::hex << v;
    float half = floatOf(bits::fromHalf(value));
    uint32_t magnitude = v & 0x7fff;
    ASSERT_EQ(std::signbit(half), (v & 0x8000) != 0) << std::hex << v;
    if (magnitude > 0x7c00) { // NaN: payload kept
      ASSERT_TRUE(std::isnan(half)) << std::hex << v;
      ASSERT_EQ((bitsOf(half) >> 13) & 0x3ff, v & 0x3ff) << std::hex << v;
    } else if (magnitude == 0x7c00) {
      ASSERT_TRUE(std::isinf(half)) << std::hex << v;
    } else {
      ASSERT_EQ(std::fabs(static_cast<double>(half)), fsdp_test::halfMagnitude(magnitude))
          << std::hex << v;
    }
  }
}

TEST(CudaKernelBits, TestValuesMatchTheHostForEveryDType) {
  for (DType dtype : kTestValueDTypes) {
    bits::ValueType type;
    ASSERT_TRUE(kernelType(dtype, type));
    for (const ValueCase &c : kValueCases) {
      std::string host(c.count * dcp::dtypeInfo(dtype).elementSize, '\0');
      ASSERT_TRUE(fillTestValues(dtype, c.keyHash, c.first, c.count, c.seed, host.data()));
      EXPECT_TRUE(deviceTestValues(type, c.keyHash, c.first, c.count, c.seed) == host)
          << dcp::dtypeInfo(dtype).name << " first " << c.first << " seed " << c.seed;
    }
  }
}

// --- Without a GPU ------------------------------------------------------------

bool oneLine(const std::string &text) {
  return !text.empty() && text.find('\n') == std::string::npos;
}

TEST(CudaBackend, WithoutCudaOrAGpuFailsWithOneLine) {
  if (!cudaBuilt()) {
    Result<int> count = cudaDeviceCount();
    ASSERT_FALSE(count);
    EXPECT_NE(count.error().find("CUDA"), std::string::npos) << count.error();
    Result<std::shared_ptr<MemoryBackend>> backend = createCudaBackend(0);
    ASSERT_FALSE(backend);
    EXPECT_NE(backend.error().find("CUDA"), std::string::npos) << backend.error();
    EXPECT_TRUE(oneLine(backend.error())) << backend.error();
    Result<std::unique_ptr<ReplicaDataPlane>> nccl =
        createNcclDataPlane(createSingleProcessCommunicator(), 0);
    ASSERT_FALSE(nccl);
    EXPECT_NE(nccl.error().find("NCCL"), std::string::npos) << nccl.error();
    return;
  }
  Result<int> count = cudaDeviceCount();
  if (count && *count > 0)
    GTEST_SKIP() << "this machine has a GPU (" << cudaDeviceDescription(0)
                 << "): the GPU tests cover it";
  ASSERT_FALSE(count);
  EXPECT_NE(count.error().find("CUDA"), std::string::npos) << count.error();
  EXPECT_NE(count.error().find("no GPU"), std::string::npos) << count.error();
  EXPECT_TRUE(oneLine(count.error())) << count.error();
  for (int device : {0, 1, -1}) {
    Result<std::shared_ptr<MemoryBackend>> backend = createCudaBackend(device);
    ASSERT_FALSE(backend);
    EXPECT_NE(backend.error().find("CUDA"), std::string::npos) << backend.error();
    EXPECT_TRUE(oneLine(backend.error())) << backend.error();
  }
  EXPECT_TRUE(oneLine(cudaDeviceDescription(0))) << cudaDeviceDescription(0);
  // NCCL (or its stand-in) fails too, at once.
  Result<std::unique_ptr<ReplicaDataPlane>> nccl =
      createNcclDataPlane(createSingleProcessCommunicator(), 0);
  ASSERT_FALSE(nccl);
  EXPECT_TRUE(oneLine(nccl.error())) << nccl.error();
  EXPECT_TRUE(nccl.error().find("CUDA") != std::string::npos ||
              nccl.error().find("NCCL") != std::string::npos)
      << nccl.error();
}

// --- On a GPU -----------------------------------------------------------------

std::shared_ptr<MemoryBackend> gpu(std::string &why) {
  if (!cudaBuilt()) {
    why = "this build has no CUDA";
    return nullptr;
  }
  Result<int> count = cudaDeviceCount();
  if (!count) {
    why = count.error();
    return nullptr;
  }
  Result<std::shared_ptr<MemoryBackend>> backend = createCudaBackend(0);
  if (!backend) {
    why = backend.error();
    return nullptr;
  }
  return backend.take();
}

#define GPU_OR_SKIP(name)                                                                          \
  std::string why;                                                                                 \
  std::shared_ptr<MemoryBackend> name = gpu(why);                                                  \
  if (!name)                                                                                       \
  GTEST_SKIP() << "no GPU: " << why

std::string fromDevice(MemoryBackend &device, const void *memory, uint64_t bytes) {
  std::string out(bytes, '\0');
  Status status = device.copyOut(memory, out.data(), bytes).get();
  EXPECT_TRUE(status) << status.error();
  return out;
}

void toDevice(MemoryBackend &device, const void *host, void *memory, uint64_t bytes) {
  Status status = device.copyIn(host, memory, bytes).get();
  ASSERT_TRUE(status) << status.error();
}

TEST(CudaBackendGpu, AllocatesZeroedAndCopiesBothWays) {
  GPU_OR_SKIP(device);
  std::printf("%s\n", cudaDeviceDescription(0).c_str());
  EXPECT_EQ(device->kind(), MemoryKind::Device);
  EXPECT_FALSE(device->hostAccessible());
  Result<void *> empty = device->allocate(0);
  ASSERT_TRUE(empty);
  EXPECT_EQ(*empty, nullptr);
  Result<void *> memory = device->allocate(10000);
  ASSERT_TRUE(memory) << memory.error();
  EXPECT_EQ(fromDevice(*device, *memory, 10000), std::string(10000, '\0'));
  std::string pattern(4000, '\0');
  for (size_t i = 0; i < pattern.size(); ++i)
    pattern[i] = static_cast<char>(i * 7);
  toDevice(*device, pattern.data(), static_cast<char *>(*memory) + 100, 4000);
  EXPECT_EQ(fromDevice(*device, static_cast<char *>(*memory) + 100, 4000), pattern);
  ASSERT_TRUE(device->zero(static_cast<char *>(*memory) + 100, 2000));
  EXPECT_EQ(fromDevice(*device, static_cast<char *>(*memory) + 100, 2000), std::string(2000, '\0'));
  // Past the allocation: an error, not a write somewhere.
  std::string back(4000, '\0');
  Status past = device->copyOut(static_cast<char *>(*memory) + 9000, back.data(), 4000).get();
  EXPECT_FALSE(past);
  EXPECT_TRUE(oneLine(past.error())) << past.error();
  EXPECT_FALSE(device->copyIn(back.data(), static_cast<char *>(*memory) + 9000, 4000).get());
  EXPECT_FALSE(device->zero(static_cast<char *>(*memory) + 9000, 4000));
  device->release(*memory);
}

TEST(CudaBackendGpu, ManyConcurrentCopiesFromFourThreads) {
  GPU_OR_SKIP(device);
  constexpr uint64_t kPiece = 1 << 20, kPieces = 64;
  Result<void *> memory = device->allocate(kPiece * kPieces);
  ASSERT_TRUE(memory) << memory.error();
  char *base = static_cast<char *>(*memory);
  std::vector<std::thread> threads;
  std::vector<std::string> failures(4);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 8; ++round) {
        std::vector<std::string> out(kPieces / 4), in(kPieces / 4);
        std::vector<std::future<Status>> pending;
        for (uint64_t k = 0; k < kPieces / 4; ++k) {
          uint64_t piece = t + 4 * k;
          out[k].assign(kPiece, static_cast<char>(piece * 31 + round));
          out[k][piece % kPiece] = static_cast<char>(round + 1);
          pending.push_back(device->copyIn(out[k].data(), base + piece * kPiece, kPiece));
        }
        for (auto &copy : pending)
          if (Status status = copy.get(); !status)
            failures[t] = status.error();
        pending.clear();
        for (uint64_t k = 0; k < kPieces / 4; ++k) {
          in[k].assign(kPiece, '\0');
          pending.push_back(device->copyOut(base + (t + 4 * k) * kPiece, in[k].data(), kPiece));
        }
        for (auto &copy : pending)
          if (Status status = copy.get(); !status)
            failures[t] = status.error();
        for (uint64_t k = 0; k < kPieces / 4; ++k)
          if (in[k] != out[k])
            failures[t] = "piece " + std::to_string(t + 4 * k) + " came back different";
      }
    });
  for (std::thread &thread : threads)
    thread.join();
  for (const std::string &failure : failures)
    EXPECT_EQ(failure, "");
  device->release(*memory);
}

TEST(CudaBackendGpu, CastKernelMatchesTheHostBitForBit) {
  GPU_OR_SKIP(device);
  std::vector<uint32_t> patterns = castPatterns(3'000'000);
  uint64_t n = patterns.size();
  Result<void *> source = device->allocate(n * 4);
  Result<void *> narrow = device->allocate(n * 2 + 2);
  Result<void *> wide = device->allocate(65536 * 4);
  ASSERT_TRUE(source && narrow && wide);
  toDevice(*device, patterns.data(), *source, n * 4);
  for (DType to : {DType::BFloat16, DType::Float16}) {
    for (uint64_t shift : {0, 1}) { // the unaligned path too
      char *out = static_cast<char *>(*narrow) + shift;
      Status cast = device->cast(DType::Float32, *source, to, out, n);
      ASSERT_TRUE(cast) << cast.error();
      std::string got = fromDevice(*device, out, n * 2);
      uint64_t bad = 0;
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t expected = to == DType::BFloat16 ? floatToBFloat16(floatOf(patterns[i]))
                                                  : floatToHalf(floatOf(patterns[i]));
        uint16_t found;
        std::memcpy(&found, &got[i * 2], 2);
        if (found != expected && ++bad <= 5)
          ADD_FAILURE() << std::hex << "f32 0x" << patterns[i] << " -> 0x" << found
                        << ", the host makes 0x" << expected;
      }
      EXPECT_EQ(bad, 0u) << dcp::dtypeInfo(to).name << " shift " << shift;
    }
  }
  // bf16/f16 -> f32: every 16-bit pattern.
  std::vector<uint16_t> all(65536);
  for (uint32_t v = 0; v < 65536; ++v)
    all[v] = static_cast<uint16_t>(v);
  toDevice(*device, all.data(), *narrow, 65536 * 2);
  for (DType from : {DType::BFloat16, DType::Float16}) {
    ASSERT_TRUE(device->cast(from, *narrow, DType::Float32, *wide, 65536));
    std::string got = fromDevice(*device, *wide, 65536 * 4);
    for (uint32_t v = 0; v < 65536; ++v) {
      uint32_t found;
      std::memcpy(&found, &got[v * 4], 4);
      float host = from == DType::BFloat16 ? bfloat16ToFloat(all[v]) : halfToFloat(all[v]);
      ASSERT_EQ(found, bitsOf(host)) << std::hex << v;
    }
  }
  // A pair without a kernel: the host's words.
  Status unsupported = device->cast(DType::Int32, *source, DType::Float32, *wide, 10);
  ASSERT_FALSE(unsupported);
  Status host = castElements(DType::Int32, nullptr, DType::Float32, nullptr, 0);
  EXPECT_EQ(unsupported.error(), host.error());
  // The same dtype is a copy, any dtype.
  ASSERT_TRUE(device->cast(DType::Int32, *source, DType::Int32, *wide, 1000));
  EXPECT_EQ(fromDevice(*device, *wide, 4000), fromDevice(*device, *source, 4000));
  device->release(*source);
  device->release(*narrow);
  device->release(*wide);
}

TEST(CudaBackendGpu, FillKernelMatchesTheHostForEveryDType) {
  GPU_OR_SKIP(device);
  ASSERT_TRUE(device->hasTestValueKernels());
  for (DType dtype : kTestValueDTypes) {
    unsigned size = dcp::dtypeInfo(dtype).elementSize;
    for (const ValueCase &c : kValueCases)
      for (uint64_t shift : {0, 1}) {
        Result<void *> memory = device->allocate(c.count * size + 1);
        ASSERT_TRUE(memory);
        char *at = static_cast<char *>(*memory) + shift;
        Status fill = device->fillTestValues(dtype, c.keyHash, c.first, c.count, c.seed, at);
        ASSERT_TRUE(fill) << fill.error();
        std::string host(c.count * size, '\0');
        ASSERT_TRUE(fillTestValues(dtype, c.keyHash, c.first, c.count, c.seed, host.data()));
        EXPECT_TRUE(fromDevice(*device, at, c.count * size) == host)
            << dcp::dtypeInfo(dtype).name << " first " << c.first << " shift " << shift;
        Status check = device->checkTestValues(dtype, c.keyHash, c.first, c.count, c.seed, at);
        EXPECT_TRUE(check) << check.error();
        device->release(*memory);
      }
  }
  // A big one (more elements than the grid has threads).
  uint64_t count = 100'000'000;
  Result<void *> big = device->allocate(count * 2);
  ASSERT_TRUE(big);
  ASSERT_TRUE(device->fillTestValues(DType::BFloat16, 42, 1000, count, 5, *big));
  std::string host(count * 2, '\0');
  ASSERT_TRUE(fillTestValues(DType::BFloat16, 42, 1000, count, 5, host.data()));
  EXPECT_TRUE(fromDevice(*device, *big, count * 2) == host);
  EXPECT_TRUE(device->checkTestValues(DType::BFloat16, 42, 1000, count, 5, *big));
  device->release(*big);
  // Without test values: the host's error.
  Result<void *> some = device->allocate(64);
  ASSERT_TRUE(some);
  Status fill = device->fillTestValues(DType::Complex64, 1, 0, 4, 0, *some);
  ASSERT_FALSE(fill);
  EXPECT_EQ(fill.error(), fillTestValues(DType::Complex64, 1, 0, 4, 0, nullptr).error());
  Status check = device->checkTestValues(DType::Float8E4M3FN, 1, 0, 4, 0, *some);
  ASSERT_FALSE(check);
  EXPECT_EQ(check.error(), checkTestValues(DType::Float8E4M3FN, 1, 0, 4, 0, nullptr).error());
  device->release(*some);
}

TEST(CudaBackendGpu, CheckKernelFindsTheFirstMismatchInTheHostsWords) {
  GPU_OR_SKIP(device);
  for (DType dtype : kTestValueDTypes) {
    unsigned size = dcp::dtypeInfo(dtype).elementSize;
    uint64_t count = 3'000'000, first = 777;
    uint32_t key = fnv1a32("planted"), seed = 9;
    Result<void *> memory = device->allocate(count * size);
    ASSERT_TRUE(memory);
    ASSERT_TRUE(device->fillTestValues(dtype, key, first, count, seed, *memory));
    std::string host(count * size, '\0');
    ASSERT_TRUE(fillTestValues(dtype, key, first, count, seed, host.data()));
    // Two planted mismatches; the first one is reported.
    for (uint64_t at : {2'500'000ull, 1'234'567ull}) {
      host[at * size] = static_cast<char>(host[at * size] ^ 0x01);
      toDevice(*device, &host[at * size], static_cast<char *>(*memory) + at * size, size);
    }
    Status device_check = device->checkTestValues(dtype, key, first, count, seed, *memory);
    Status host_check = checkTestValues(dtype, key, first, count, seed, host.data());
    ASSERT_FALSE(device_check);
    ASSERT_FALSE(host_check);
    EXPECT_EQ(device_check.error(), host_check.error());
    EXPECT_NE(device_check.error().find("element " + std::to_string(first + 1'234'567)),
              std::string::npos)
        << device_check.error();
    device->release(*memory);
  }
}

TEST(CudaBackendGpu, PinsHostMemoryInOneRegistration) {
  GPU_OR_SKIP(device);
  uint64_t bytes = (5ull << 30) / 2; // 2.5 GiB: once registered in 1 GiB pieces
  void *host = std::aligned_alloc(4096, bytes);
  ASSERT_NE(host, nullptr);
  std::memset(host, 1, bytes);
  Status pinned = device->pinHostMemory(host, bytes);
  ASSERT_TRUE(pinned) << pinned.error();
  EXPECT_EQ(device->pinnedHostBytes(), bytes);
  // Copies from pinned memory work (and are the fast path).
  Result<void *> memory = device->allocate(1 << 20);
  ASSERT_TRUE(memory);
  toDevice(*device, static_cast<char *>(host) + bytes - (1 << 20), *memory, 1 << 20);
  EXPECT_EQ(fromDevice(*device, *memory, 1 << 20), std::string(1 << 20, '\1'));
  // Across the 1 GiB mark: the copy that failed on an H200 with pieces
  // (cudaErrorInvalidValue, an async save's snapshot).
  char *acrossGiB = static_cast<char *>(host) + (1ull << 30) - (1 << 19);
  toDevice(*device, acrossGiB, *memory, 1 << 20);
  Status back = device->copyOut(*memory, acrossGiB, 1 << 20).get();
  EXPECT_TRUE(back) << back.error();
  device->release(*memory);
  device->unpinHostMemory(host, bytes);
  EXPECT_EQ(device->pinnedHostBytes(), 0u);
  std::free(host);
}

TEST(CudaBackendGpu, BadDeviceIndexIsAnError) {
  GPU_OR_SKIP(device);
  Result<int> count = cudaDeviceCount();
  ASSERT_TRUE(count);
  for (int bad : {-1, *count, *count + 7}) {
    Result<std::shared_ptr<MemoryBackend>> backend = createCudaBackend(bad);
    ASSERT_FALSE(backend);
    EXPECT_TRUE(oneLine(backend.error())) << backend.error();
    EXPECT_NE(backend.error().find("device " + std::to_string(bad)), std::string::npos)
        << backend.error();
  }
  // Out of memory: an error of kind I/O, not an abort.
  Result<void *> huge = device->allocate(1ull << 50);
  ASSERT_FALSE(huge);
  EXPECT_EQ(huge.kind(), ErrorKind::IO) << huge.error();
  // The backend still works afterwards.
  Result<void *> small = device->allocate(16);
  ASSERT_TRUE(small) << small.error();
  device->release(*small);
}

TEST(CudaBackendGpu, NcclBroadcastInAWorldOfOne) {
  GPU_OR_SKIP(device);
  Result<std::unique_ptr<ReplicaDataPlane>> plane =
      createNcclDataPlane(createSingleProcessCommunicator(), 0);
#ifndef FSDP_HAVE_NCCL
  ASSERT_FALSE(plane);
  EXPECT_NE(plane.error().find("NCCL"), std::string::npos);
#else
  ASSERT_TRUE(plane) << plane.error();
  EXPECT_STREQ((*plane)->name(), "nccl");
  EXPECT_EQ((*plane)->group().size(), 1);
  Result<void *> memory = device->allocate(3 << 20);
  ASSERT_TRUE(memory);
  ASSERT_TRUE(device->fillTestValues(DType::Float32, 3, 0, 3 << 18, 1, *memory));
  std::vector<ReplicaDataPlane::Transfer> transfers = {
      {*memory, 1 << 20, 0}, {static_cast<char *>(*memory) + (1 << 20), 2 << 20, 0}};
  Status sent = (*plane)->broadcast(transfers, *device);
  ASSERT_TRUE(sent) << sent.error();
  EXPECT_TRUE(device->checkTestValues(DType::Float32, 3, 0, 3 << 18, 1, *memory));
  // Host memory goes over the communicator.
  std::string text = "host bytes";
  std::shared_ptr<MemoryBackend> hostBackend = createHostBackend();
  EXPECT_TRUE((*plane)->broadcast({{text.data(), text.size(), 0}}, *hostBackend));
  EXPECT_EQ(text, "host bytes");
  device->release(*memory);
#endif
}

} // namespace
