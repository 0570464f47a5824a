//===- Kernels.cu - Casts and test values in device memory ----------------===//
//
// Grid-stride loops with 64-bit indices over the element functions of
// ElementBits.h (the host's integer arithmetic, bit for bit). Memory that is
// not aligned to its element size is read and written byte by byte.
//
//===----------------------------------------------------------------------===//
#include "Kernels.h"

#include <cuda_runtime.h>

#include <type_traits>

namespace fsdp {
namespace runtime {
namespace cudakernels {

namespace {

using namespace elementbits;

constexpr unsigned kThreads = 256;
constexpr uint64_t kMaxBlocks = 8192; // the loops stride over the rest

unsigned blocksFor(uint64_t count) {
  uint64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename T, bool Aligned>
__device__ __forceinline__ T load(const unsigned char *base, uint64_t i) {
  if constexpr (Aligned) {
    return reinterpret_cast<const T *>(base)[i];
  } else {
    const unsigned char *p = base + i * sizeof(T);
    T value = 0;
    for (unsigned b = 0; b < sizeof(T); ++b) // little-endian, as the host
      value |= static_cast<T>(static_cast<T>(p[b]) << (8 * b));
    return value;
  }
}

template <typename T, bool Aligned>
__device__ __forceinline__ void store(unsigned char *base, uint64_t i, T value) {
  if constexpr (Aligned) {
    reinterpret_cast<T *>(base)[i] = value;
  } else {
    unsigned char *p = base + i * sizeof(T);
    for (unsigned b = 0; b < sizeof(T); ++b)
      p[b] = static_cast<unsigned char>(value >> (8 * b));
  }
}

template <ValueType V> struct FloatStorage;
template <> struct FloatStorage<ValueType::Float64> { using type = uint64_t; };
template <> struct FloatStorage<ValueType::Float32> { using type = uint32_t; };
template <> struct FloatStorage<ValueType::BFloat16> { using type = uint16_t; };
template <> struct FloatStorage<ValueType::Float16> { using type = uint16_t; };

/// An element of `From` as f32 bits (f64 rounds to nearest even, as the
/// host's static_cast<float>).
template <ValueType From>
__device__ __forceinline__ uint32_t asFloatBits(typename FloatStorage<From>::type v) {
  if constexpr (From == ValueType::Float64)
    return floatBits(static_cast<float>(bitsDouble(v)));
  else if constexpr (From == ValueType::Float32)
    return v;
  else if constexpr (From == ValueType::BFloat16)
    return fromBFloat16(v);
  else
    return fromHalf(v);
}

template <ValueType From, ValueType To>
__device__ __forceinline__ typename FloatStorage<To>::type
convert(typename FloatStorage<From>::type v) {
  if constexpr (To == ValueType::Float64) {
    // Every narrower float is exact in f64.
    return doubleBits(static_cast<double>(bitsFloat(asFloatBits<From>(v))));
  } else {
    uint32_t bits = asFloatBits<From>(v);
    if constexpr (To == ValueType::Float32)
      return bits;
    else if constexpr (To == ValueType::BFloat16)
      return toBFloat16(bits);
    else
      return toHalf(bits);
  }
}

template <ValueType From, ValueType To, bool Aligned>
__global__ void castKernel(const unsigned char *in, unsigned char *out, uint64_t count) {
  using S = typename FloatStorage<From>::type;
  using D = typename FloatStorage<To>::type;
  uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    store<D, Aligned>(out, i, convert<From, To>(load<S, Aligned>(in, i)));
}

template <ValueType V, bool Aligned>
__global__ void fillKernel(uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed,
                           unsigned char *out) {
  using T = typename TestElement<V>::type;
  uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    store<T, Aligned>(out, i, TestElement<V>::make(testValue(keyHash, first + i, seed)));
}

template <ValueType V, bool Aligned>
__global__ void checkKernel(uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed,
                            const unsigned char *in, unsigned long long *mismatch) {
  using T = typename TestElement<V>::type;
  uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    if (load<T, Aligned>(in, i) != TestElement<V>::make(testValue(keyHash, first + i, seed))) {
      atomicMin(mismatch, static_cast<unsigned long long>(i)); // this thread's later ones are larger
      return;
    }
}

bool aligned(const void *pointer, unsigned size) {
  return reinterpret_cast<uintptr_t>(pointer) % size == 0;
}

int launched() { return static_cast<int>(cudaGetLastError()); }

bool isFloat(ValueType type) {
  return type == ValueType::Float64 || type == ValueType::Float32 ||
         type == ValueType::BFloat16 || type == ValueType::Float16;
}

unsigned floatSize(ValueType type) {
  switch (type) {
  case ValueType::Float64:
    return 8;
  case ValueType::Float32:
    return 4;
  default:
    return 2;
  }
}

template <ValueType From, ValueType To>
int castPair(const void *in, void *out, uint64_t count, cudaStream_t stream) {
  const auto *src = static_cast<const unsigned char *>(in);
  auto *dst = static_cast<unsigned char *>(out);
  if (aligned(in, sizeof(typename FloatStorage<From>::type)) &&
      aligned(out, sizeof(typename FloatStorage<To>::type)))
    castKernel<From, To, true><<<blocksFor(count), kThreads, 0, stream>>>(src, dst, count);
  else
    castKernel<From, To, false><<<blocksFor(count), kThreads, 0, stream>>>(src, dst, count);
  return launched();
}

template <ValueType From>
int castFrom(const void *in, ValueType to, void *out, uint64_t count, cudaStream_t stream) {
  switch (to) {
  case ValueType::Float64:
    return castPair<From, ValueType::Float64>(in, out, count, stream);
  case ValueType::Float32:
    return castPair<From, ValueType::Float32>(in, out, count, stream);
  case ValueType::BFloat16:
    return castPair<From, ValueType::BFloat16>(in, out, count, stream);
  case ValueType::Float16:
    return castPair<From, ValueType::Float16>(in, out, count, stream);
  default:
    return static_cast<int>(cudaErrorInvalidValue);
  }
}

template <ValueType V>
int fillTyped(uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed, void *out,
              cudaStream_t stream) {
  auto *dst = static_cast<unsigned char *>(out);
  if (aligned(out, sizeof(typename TestElement<V>::type)))
    fillKernel<V, true><<<blocksFor(count), kThreads, 0, stream>>>(keyHash, first, count, seed, dst);
  else
    fillKernel<V, false><<<blocksFor(count), kThreads, 0, stream>>>(keyHash, first, count, seed,
                                                                    dst);
  return launched();
}

template <ValueType V>
int checkTyped(uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed, const void *in,
               unsigned long long *mismatch, cudaStream_t stream) {
  const auto *src = static_cast<const unsigned char *>(in);
  if (aligned(in, sizeof(typename TestElement<V>::type)))
    checkKernel<V, true>
        <<<blocksFor(count), kThreads, 0, stream>>>(keyHash, first, count, seed, src, mismatch);
  else
    checkKernel<V, false>
        <<<blocksFor(count), kThreads, 0, stream>>>(keyHash, first, count, seed, src, mismatch);
  return launched();
}

/// Calls visit(std::integral_constant<ValueType, V>) for `type`.
template <typename Visit> int visitType(ValueType type, Visit visit) {
#define FSDP_VISIT(V)                                                                              \
  case ValueType::V:                                                                               \
    return visit(std::integral_constant<ValueType, ValueType::V>{});
  switch (type) {
    FSDP_VISIT(Float64)
    FSDP_VISIT(Float32)
    FSDP_VISIT(BFloat16)
    FSDP_VISIT(Float16)
    FSDP_VISIT(Int64)
    FSDP_VISIT(Int32)
    FSDP_VISIT(Int16)
    FSDP_VISIT(Int8)
    FSDP_VISIT(UInt8)
    FSDP_VISIT(UInt16)
    FSDP_VISIT(UInt32)
    FSDP_VISIT(UInt64)
    FSDP_VISIT(Bool)
  }
#undef FSDP_VISIT
  return static_cast<int>(cudaErrorInvalidValue);
}

} // namespace

bool castSupported(ValueType from, ValueType to) { return isFloat(from) && isFloat(to); }

int launchCast(ValueType from, const void *in, ValueType to, void *out, uint64_t count,
               void *stream) {
  if (!castSupported(from, to))
    return static_cast<int>(cudaErrorInvalidValue);
  if (!count)
    return 0;
  auto s = static_cast<cudaStream_t>(stream);
  (void)cudaGetLastError(); // launched() reports this launch alone
  if (from == to) {
    if (in == out)
      return 0;
    return static_cast<int>(
        cudaMemcpyAsync(out, in, count * floatSize(from), cudaMemcpyDeviceToDevice, s));
  }
  switch (from) {
  case ValueType::Float64:
    return castFrom<ValueType::Float64>(in, to, out, count, s);
  case ValueType::Float32:
    return castFrom<ValueType::Float32>(in, to, out, count, s);
  case ValueType::BFloat16:
    return castFrom<ValueType::BFloat16>(in, to, out, count, s);
  case ValueType::Float16:
    return castFrom<ValueType::Float16>(in, to, out, count, s);
  default:
    return static_cast<int>(cudaErrorInvalidValue);
  }
}

int launchFill(ValueType type, uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed,
               void *out, void *stream) {
  if (!count)
    return 0;
  (void)cudaGetLastError();
  return visitType(type, [&](auto v) {
    return fillTyped<decltype(v)::value>(keyHash, first, count, seed, out,
                                         static_cast<cudaStream_t>(stream));
  });
}

int launchCheck(ValueType type, uint32_t keyHash, uint64_t first, uint64_t count, uint32_t seed,
                const void *in, unsigned long long *mismatch, void *stream) {
  if (!count)
    return 0;
  (void)cudaGetLastError();
  return visitType(type, [&](auto v) {
    return checkTyped<decltype(v)::value>(keyHash, first, count, seed, in, mismatch,
                                          static_cast<cudaStream_t>(stream));
  });
}

} // namespace cudakernels
} // namespace runtime
} // namespace fsdp
