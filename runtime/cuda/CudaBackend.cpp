//===- CudaBackend.cpp - Buffers in one GPU's memory ----------------------===//
//
// Copies go on a few non-blocking streams in turn, each followed by an
// event from a pool; the copy's future waits on its event and gives it
// back. Any host thread may issue copies at once: the device is made
// current on the calling thread first (cudaSetDevice is per thread, and
// cheap). Casts, zeroing and the test values run on the streams too and are
// waited for before the call returns. Every CUDA error becomes a one-line
// Status naming the call, the error and the device; nothing aborts.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Runtime/CudaBackend.h"
#include "fsdp/Runtime/Cast.h"
#include "fsdp/Runtime/Values.h"

#include "Kernels.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace fsdp {
namespace runtime {

namespace {

using elementbits::ValueType;

constexpr unsigned kStreams = 4;

std::string cudaErrorText(cudaError_t code) {
  return std::string(cudaGetErrorString(code)) + " (" + cudaGetErrorName(code) + ")";
}

/// "CUDA <what> on device <d>: <error string> (<error name>)"; out of memory
/// is an I/O error (ENOMEM), anything else internal.
Error cudaFailure(cudaError_t code, const std::string &what, int device) {
  (void)cudaGetLastError(); // a non-sticky error must not surface at the next launch
  bool oom = code == cudaErrorMemoryAllocation;
  return makeError("CUDA " + what + " on device " + std::to_string(device) + ": " +
                       cudaErrorText(code),
                   oom ? ErrorKind::IO : ErrorKind::Internal, oom ? ENOMEM : 0);
}

std::future<Status> done(Status status) {
  std::promise<Status> promise;
  promise.set_value(std::move(status));
  return promise.get_future();
}

const char *dtypeText(dcp::DType dtype) {
  const dcp::DTypeInfo &info = dcp::dtypeInfo(dtype);
  return info.dtype == dtype ? info.name : "?";
}

bool kernelType(dcp::DType dtype, ValueType &type) {
  using dcp::DType;
  switch (dtype) {
  case DType::Float64:
    type = ValueType::Float64;
    return true;
  case DType::Float32:
    type = ValueType::Float32;
    return true;
  case DType::BFloat16:
    type = ValueType::BFloat16;
    return true;
  case DType::Float16:
    type = ValueType::Float16;
    return true;
  case DType::Int64:
    type = ValueType::Int64;
    return true;
  case DType::Int32:
    type = ValueType::Int32;
    return true;
  case DType::Int16:
    type = ValueType::Int16;
    return true;
  case DType::Int8:
    type = ValueType::Int8;
    return true;
  case DType::UInt8:
    type = ValueType::UInt8;
    return true;
  case DType::UInt16:
    type = ValueType::UInt16;
    return true;
  case DType::UInt32:
    type = ValueType::UInt32;
    return true;
  case DType::UInt64:
    type = ValueType::UInt64;
    return true;
  case DType::Bool:
    type = ValueType::Bool;
    return true;
  default:
    return false;
  }
}

/// Completion events, reused: a copy takes one, its future gives it back.
/// Shared with the futures, so that a future outliving the backend stays
/// valid.
struct EventPool {
  explicit EventPool(int device) : device(device) {}
  ~EventPool() {
    for (cudaEvent_t event : free)
      (void)cudaEventDestroy(event);
  }
  Result<cudaEvent_t> take() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!free.empty()) {
        cudaEvent_t event = free.back();
        free.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    // Blocking sync: a waiting worker sleeps instead of spinning a core.
    cudaError_t code =
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync);
    if (code != cudaSuccess)
      return cudaFailure(code, "cudaEventCreateWithFlags", device);
    return event;
  }
  void give(cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex);
    free.push_back(event);
  }

  const int device;
  std::mutex mutex;
  std::vector<cudaEvent_t> free;
};

/// An event taken from the pool, given back when the completion that
/// holds it is destroyed (waited for or not).
struct EventLease {
  EventLease(std::shared_ptr<EventPool> pool, cudaEvent_t event)
      : pool(std::move(pool)), event(event) {}
  ~EventLease() { pool->give(event); }
  EventLease(const EventLease &) = delete;
  EventLease &operator=(const EventLease &) = delete;
  std::shared_ptr<EventPool> pool;
  cudaEvent_t event;
};

class CudaBackend : public MemoryBackend {
public:
  static Result<std::shared_ptr<MemoryBackend>> create(int device) {
    cudaError_t code = cudaSetDevice(device);
    if (code != cudaSuccess)
      return cudaFailure(code, "cudaSetDevice", device);
    auto backend = std::shared_ptr<CudaBackend>(new CudaBackend(device));
    for (cudaStream_t &stream : backend->streams_) {
      code = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      if (code != cudaSuccess)
        return cudaFailure(code, "cudaStreamCreateWithFlags", device);
    }
    return std::shared_ptr<MemoryBackend>(std::move(backend));
  }

  ~CudaBackend() override {
    if (cudaSetDevice(device_) != cudaSuccess)
      return; // no context left (process exit): nothing to give back
    for (cudaStream_t stream : streams_)
      if (stream) {
        (void)cudaStreamSynchronize(stream);
        (void)cudaStreamDestroy(stream);
      }
    for (unsigned long long *word : words_)
      (void)cudaFree(word);
    for (auto &[memory, bytes] : pinned_)
      (void)cudaHostUnregister(reinterpret_cast<void *>(memory));
    (void)cudaGetLastError();
  }

  MemoryKind kind() const override { return MemoryKind::Device; }
  bool hostAccessible() const override { return false; }

  Result<void *> allocate(uint64_t bytes) override {
    if (!bytes)
      return static_cast<void *>(nullptr);
    if (Status status = makeCurrent(); !status)
      return status.failure();
    void *memory = nullptr;
    cudaError_t code = cudaMalloc(&memory, bytes);
    if (code != cudaSuccess)
      return cudaFailure(code, "cudaMalloc of " + std::to_string(bytes) + " bytes", device_);
    cudaStream_t stream = nextStream();
    code = cudaMemsetAsync(memory, 0, bytes, stream);
    Status zeroed = code == cudaSuccess
                        ? finish(stream, "cudaMemsetAsync (zeroing an allocation)")
                        : Status(cudaFailure(code, "cudaMemsetAsync (zeroing an allocation)",
                                             device_));
    if (!zeroed) {
      (void)cudaFree(memory);
      return zeroed.failure();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    allocations_[reinterpret_cast<uintptr_t>(memory)] = bytes;
    return memory;
  }

  void release(void *memory) override {
    if (!memory)
      return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      allocations_.erase(reinterpret_cast<uintptr_t>(memory));
    }
    if (cudaSetDevice(device_) == cudaSuccess)
      (void)cudaFree(memory);
    (void)cudaGetLastError();
  }

  std::future<Status> copyOut(const void *source, void *destination, uint64_t bytes) override {
    return copy(source, destination, bytes, source, cudaMemcpyDeviceToHost, "copy out");
  }
  std::future<Status> copyIn(const void *source, void *destination, uint64_t bytes) override {
    return copy(source, destination, bytes, destination, cudaMemcpyHostToDevice, "copy in");
  }

  Status zero(void *memory, uint64_t bytes) override {
    if (!bytes)
      return Status::success();
    if (Status status = inRange(memory, bytes, "zero"); !status)
      return status;
    if (Status status = makeCurrent(); !status)
      return status;
    cudaStream_t stream = nextStream();
    cudaError_t code = cudaMemsetAsync(memory, 0, bytes, stream);
    if (code != cudaSuccess)
      return cudaFailure(code, "cudaMemsetAsync of " + std::to_string(bytes) + " bytes", device_);
    return finish(stream, "cudaMemsetAsync");
  }

  Status cast(dcp::DType from, const void *source, dcp::DType to, void *destination,
              uint64_t elements) override {
    ValueType fromType, toType;
    bool known = kernelType(from, fromType) && kernelType(to, toType);
    if (from == to && (!known || !cudakernels::castSupported(fromType, toType))) {
      // Any dtype: the same dtype is a copy.
      if (!elements || source == destination)
        return Status::success();
      uint64_t bytes = elements * dcp::dtypeInfo(from).elementSize;
      if (Status status = inRange(source, bytes, "cast"); !status)
        return status;
      if (Status status = inRange(destination, bytes, "cast"); !status)
        return status;
      if (Status status = makeCurrent(); !status)
        return status;
      cudaStream_t stream = nextStream();
      cudaError_t code =
          cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream);
      if (code != cudaSuccess)
        return cudaFailure(code, "cudaMemcpyAsync (device to device)", device_);
      return finish(stream, "cudaMemcpyAsync (device to device)");
    }
    if (!known || !cudakernels::castSupported(fromType, toType)) {
      // The host's words for a pair it does not cast either.
      Status host = castElements(from, nullptr, to, nullptr, 0);
      if (!host)
        return host;
      return makeError(std::string("CUDA: no cast kernel from ") + dtypeText(from) + " to " +
                           dtypeText(to),
                       ErrorKind::InvalidArgument);
    }
    if (!elements)
      return Status::success();
    if (Status status = inRange(source, elements * dcp::dtypeInfo(from).elementSize, "cast");
        !status)
      return status;
    if (Status status = inRange(destination, elements * dcp::dtypeInfo(to).elementSize, "cast");
        !status)
      return status;
    if (Status status = makeCurrent(); !status)
      return status;
    cudaStream_t stream = nextStream();
    std::string what = std::string("cast kernel (") + dtypeText(from) + " to " + dtypeText(to) +
                       ", " + std::to_string(elements) + " elements)";
    auto code = static_cast<cudaError_t>(
        cudakernels::launchCast(fromType, source, toType, destination, elements, stream));
    if (code != cudaSuccess)
      return cudaFailure(code, what, device_);
    return finish(stream, what);
  }

  // One registration per call: a copy whose host range crosses from one
  // registration into another fails (cudaErrorInvalidValue, seen on an H200
  // when a 6.4 GB snapshot was registered in 1 GiB pieces), and callers copy
  // anywhere within what they pinned.
  Status pinHostMemory(void *memory, uint64_t bytes) override {
    if (!memory || !bytes)
      return makeError("CUDA: nothing to pin", ErrorKind::InvalidArgument);
    if (Status status = makeCurrent(); !status)
      return status;
    cudaError_t code = cudaHostRegister(memory, bytes, cudaHostRegisterDefault);
    if (code != cudaSuccess)
      return cudaFailure(code, "cudaHostRegister of " + std::to_string(bytes) + " host bytes",
                         device_);
    std::lock_guard<std::mutex> lock(mutex_);
    pinned_[reinterpret_cast<uintptr_t>(memory)] = bytes;
    return Status::success();
  }

  void unpinHostMemory(void *memory, uint64_t) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!pinned_.erase(reinterpret_cast<uintptr_t>(memory)))
        return;
    }
    if (cudaSetDevice(device_) == cudaSuccess)
      (void)cudaHostUnregister(memory);
    (void)cudaGetLastError();
  }

  uint64_t pinnedHostBytes() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t total = 0;
    for (const auto &[memory, bytes] : pinned_)
      total += bytes;
    return total;
  }

  bool hasTestValueKernels() const override { return true; }

  Status fillTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement, uint64_t count,
                        uint32_t seed, void *memory) override {
    ValueType type;
    if (!kernelType(dtype, type))
      return noKernel(dtype, keyHash, firstElement, seed);
    if (!count)
      return Status::success();
    if (Status status = inRange(memory, count * dcp::dtypeInfo(dtype).elementSize, "fill");
        !status)
      return status;
    if (Status status = makeCurrent(); !status)
      return status;
    cudaStream_t stream = nextStream();
    std::string what = std::string("test-value fill kernel (") + dtypeText(dtype) + ", " +
                       std::to_string(count) + " elements)";
    auto code = static_cast<cudaError_t>(
        cudakernels::launchFill(type, keyHash, firstElement, count, seed, memory, stream));
    if (code != cudaSuccess)
      return cudaFailure(code, what, device_);
    return finish(stream, what);
  }

  Status checkTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement, uint64_t count,
                         uint32_t seed, const void *memory) override {
    ValueType type;
    if (!kernelType(dtype, type))
      return noKernel(dtype, keyHash, firstElement, seed);
    if (!count)
      return Status::success();
    unsigned elementSize = dcp::dtypeInfo(dtype).elementSize;
    if (Status status = inRange(memory, count * elementSize, "check"); !status)
      return status;
    if (Status status = makeCurrent(); !status)
      return status;
    Result<unsigned long long *> word = takeWord();
    if (!word)
      return word.failure();
    cudaStream_t stream = nextStream();
    std::string what = std::string("test-value check kernel (") + dtypeText(dtype) + ", " +
                       std::to_string(count) + " elements)";
    unsigned long long mismatch = 0;
    cudaError_t code = cudaMemsetAsync(*word, 0xff, sizeof(unsigned long long), stream);
    if (code == cudaSuccess)
      code = static_cast<cudaError_t>(cudakernels::launchCheck(type, keyHash, firstElement, count,
                                                               seed, memory, *word, stream));
    if (code == cudaSuccess)
      code = cudaMemcpyAsync(&mismatch, *word, sizeof mismatch, cudaMemcpyDeviceToHost, stream);
    Status finished = code == cudaSuccess ? finish(stream, what)
                                          : Status(cudaFailure(code, what, device_));
    giveWord(*word);
    if (!finished)
      return finished;
    if (mismatch == ~0ull)
      return Status::success();
    // The first mismatching element, back on the host: the host's check of
    // that one element words the error as the host-side check would.
    unsigned char found[16] = {};
    const char *at = static_cast<const char *>(memory) + mismatch * elementSize;
    code = cudaMemcpyAsync(found, at, elementSize, cudaMemcpyDeviceToHost, stream);
    if (code != cudaSuccess)
      return cudaFailure(code, "cudaMemcpyAsync (a mismatching element)", device_);
    if (Status status = finish(stream, "cudaMemcpyAsync (a mismatching element)"); !status)
      return status;
    Status host = runtime::checkTestValues(dtype, keyHash, firstElement + mismatch, 1, seed, found);
    if (!host)
      return host;
    return makeError("CUDA: the check kernel reports element " +
                         std::to_string(firstElement + mismatch) +
                         " as a mismatch but the host finds it right",
                     ErrorKind::Internal);
  }

private:
  explicit CudaBackend(int device) : device_(device), events_(std::make_shared<EventPool>(device)) {}

  Status makeCurrent() {
    cudaError_t code = cudaSetDevice(device_);
    if (code != cudaSuccess)
      return cudaFailure(code, "cudaSetDevice", device_);
    return Status::success();
  }

  cudaStream_t nextStream() {
    return streams_[next_.fetch_add(1, std::memory_order_relaxed) % kStreams];
  }

  /// Waits for what was issued on `stream` so far (through an event: other
  /// threads' later work on the stream is not waited for).
  Status finish(cudaStream_t stream, const std::string &what) {
    Result<cudaEvent_t> event = events_->take();
    if (!event)
      return event.failure();
    EventLease lease(events_, *event);
    cudaError_t code = cudaEventRecord(*event, stream);
    if (code == cudaSuccess)
      code = cudaEventSynchronize(*event);
    if (code != cudaSuccess)
      return cudaFailure(code, what, device_);
    return Status::success();
  }

  /// Device memory [pointer, +bytes) must lie within one allocation when it
  /// starts in one of this backend's (memory from elsewhere, a caller's,
  /// is left to CUDA to check).
  Status inRange(const void *pointer, uint64_t bytes, const char *what) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto address = reinterpret_cast<uintptr_t>(pointer);
    auto found = allocations_.upper_bound(address);
    if (found == allocations_.begin())
      return Status::success();
    --found;
    uint64_t offset = address - found->first;
    if (offset >= found->second)
      return Status::success(); // past this allocation: not one of ours
    if (bytes > found->second - offset)
      return makeError("CUDA " + std::string(what) + " of " + std::to_string(bytes) +
                           " bytes at offset " + std::to_string(offset) + " of a " +
                           std::to_string(found->second) + "-byte allocation on device " +
                           std::to_string(device_) + " runs past its end",
                       ErrorKind::InvalidArgument);
    return Status::success();
  }

  std::future<Status> copy(const void *source, void *destination, uint64_t bytes,
                           const void *deviceSide, cudaMemcpyKind direction, const char *what) {
    if (!bytes)
      return done(Status::success());
    if (Status status = inRange(deviceSide, bytes, what); !status)
      return done(std::move(status));
    if (Status status = makeCurrent(); !status)
      return done(std::move(status));
    Result<cudaEvent_t> event = events_->take();
    if (!event)
      return done(event.failure());
    auto lease = std::make_shared<EventLease>(events_, *event);
    cudaStream_t stream = nextStream();
    cudaError_t code = cudaMemcpyAsync(destination, source, bytes, direction, stream);
    if (code == cudaSuccess)
      code = cudaEventRecord(*event, stream);
    if (code != cudaSuccess)
      return done(cudaFailure(
          code, std::string("cudaMemcpyAsync (") + what + ", " + std::to_string(bytes) + " bytes)",
          device_));
    int device = device_;
    return std::async(std::launch::deferred, [lease, device, bytes, what]() -> Status {
      (void)cudaSetDevice(device);
      cudaError_t code = cudaEventSynchronize(lease->event);
      if (code != cudaSuccess)
        return cudaFailure(code,
                           std::string("cudaMemcpyAsync (") + what + ", " + std::to_string(bytes) +
                               " bytes) completion",
                           device);
      return Status::success();
    });
  }

  Result<unsigned long long *> takeWord() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!freeWords_.empty()) {
        unsigned long long *word = freeWords_.back();
        freeWords_.pop_back();
        return word;
      }
    }
    void *word = nullptr;
    cudaError_t code = cudaMalloc(&word, sizeof(unsigned long long));
    if (code != cudaSuccess)
      return cudaFailure(code, "cudaMalloc (a check kernel's result word)", device_);
    std::lock_guard<std::mutex> lock(mutex_);
    words_.push_back(static_cast<unsigned long long *>(word));
    return static_cast<unsigned long long *>(word);
  }
  void giveWord(unsigned long long *word) {
    std::lock_guard<std::mutex> lock(mutex_);
    freeWords_.push_back(word);
  }

  /// The host function's error for a dtype without test values.
  static Status noKernel(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement, uint32_t seed) {
    Status host = runtime::fillTestValues(dtype, keyHash, firstElement, 0, seed, nullptr);
    if (!host)
      return host;
    return makeError(std::string("CUDA: no test-value kernel for dtype ") + dtypeText(dtype),
                     ErrorKind::Internal);
  }

  const int device_;
  cudaStream_t streams_[kStreams] = {};
  std::atomic<unsigned> next_{0};
  std::shared_ptr<EventPool> events_;
  mutable std::mutex mutex_;
  std::map<uintptr_t, uint64_t> allocations_;
  std::map<uintptr_t, uint64_t> pinned_; // host memory registered, one call each
  std::vector<unsigned long long *> words_, freeWords_;
};

} // namespace

bool cudaBuilt() { return true; }

Result<int> cudaDeviceCount() {
  int count = 0;
  cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    (void)cudaGetLastError();
    std::string hint;
    if (code == cudaErrorInsufficientDriver)
      hint = " (no NVIDIA driver is loaded, or one older than this build's CUDA " +
             std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) +
             ")";
    return makeError("CUDA: no GPU was found: cudaGetDeviceCount failed: " + cudaErrorText(code) +
                         hint,
                     ErrorKind::InvalidArgument);
  }
  if (count <= 0)
    return makeError("CUDA: no GPU was found (cudaGetDeviceCount reports 0 devices)",
                     ErrorKind::InvalidArgument);
  return count;
}

Result<std::shared_ptr<MemoryBackend>> createCudaBackend(int device) {
  Result<int> count = cudaDeviceCount();
  if (!count)
    return count.failure();
  if (device < 0 || device >= *count)
    return makeError("CUDA: there is no device " + std::to_string(device) + " (this process sees " +
                         std::to_string(*count) + " GPU" + (*count == 1 ? "" : "s") + ")",
                     ErrorKind::InvalidArgument);
  return CudaBackend::create(device);
}

std::string cudaDeviceDescription(int device) {
  cudaDeviceProp properties;
  std::memset(&properties, 0, sizeof properties);
  cudaError_t code = cudaGetDeviceProperties(&properties, device);
  if (code != cudaSuccess) {
    (void)cudaGetLastError();
    return "CUDA device " + std::to_string(device) + ": " + cudaErrorText(code);
  }
  char bus[32] = "?";
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
    (void)cudaGetLastError();
    std::snprintf(bus, sizeof bus, "?");
  }
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.1f GiB",
                static_cast<double>(properties.totalGlobalMem) / (1024.0 * 1024 * 1024));
  return "CUDA device " + std::to_string(device) + ": " + properties.name + ", " + memory +
         ", compute capability " + std::to_string(properties.major) + "." +
         std::to_string(properties.minor) + ", PCI " + bus;
}

} // namespace runtime
} // namespace fsdp
