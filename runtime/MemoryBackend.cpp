//===- MemoryBackend.cpp - Host memory and a simulated device -------------===//
#include "fsdp/Runtime/MemoryBackend.h"
#include "fsdp/Runtime/Cast.h"
#include "fsdp/Runtime/Values.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

namespace fsdp {
namespace runtime {

const char *memoryKindName(MemoryKind kind) {
  switch (kind) {
  case MemoryKind::Host:
    return "host";
  case MemoryKind::PinnedHost:
    return "pinned host";
  case MemoryKind::Device:
    return "device";
  }
  return "?";
}

Status MemoryBackend::fillTestValues(dcp::DType, uint32_t, uint64_t, uint64_t, uint32_t, void *) {
  return makeError(std::string(memoryKindName(kind())) + " memory has no test-value kernels",
                   ErrorKind::Internal);
}

Status MemoryBackend::checkTestValues(dcp::DType, uint32_t, uint64_t, uint64_t, uint32_t,
                                      const void *) {
  return makeError(std::string(memoryKindName(kind())) + " memory has no test-value kernels",
                   ErrorKind::Internal);
}

namespace {

std::future<Status> done(Status status) {
  std::promise<Status> promise;
  promise.set_value(std::move(status));
  return promise.get_future();
}

class HostBackend : public MemoryBackend {
public:
  MemoryKind kind() const override { return MemoryKind::Host; }
  bool hostAccessible() const override { return true; }
  Result<void *> allocate(uint64_t bytes) override {
    // Page aligned (direct I/O wants it), rounded up as aligned_alloc needs.
    // Large blocks are aligned to a huge page and asked for huge pages
    // (transparent huge pages are often "madvise" only): touching them then
    // faults once per 2 MiB, not per 4 KiB. Measured here: zeroing and
    // filling 1.87 GB took 0.8-1.2 s so, 2.4-3.4 s in small pages, where
    // the memory had been backed before (SaveSnapshot: not so where not).
    constexpr uint64_t kHugePage = uint64_t(2) << 20;
    uint64_t alignment = bytes >= kHugePage ? kHugePage : 4096;
    uint64_t rounded = (bytes + alignment - 1) / alignment * alignment;
    if (!rounded)
      return static_cast<void *>(nullptr);
    void *memory = std::aligned_alloc(alignment, rounded);
    if (!memory)
      return makeError("cannot allocate " + std::to_string(bytes) + " bytes of host memory",
                       ErrorKind::IO, ENOMEM);
    if (alignment == kHugePage)
      (void)::madvise(memory, rounded, MADV_HUGEPAGE); // a hint: refused, small pages serve
    std::memset(memory, 0, rounded);
    return memory;
  }
  void release(void *memory) override { std::free(memory); }
  Status zero(void *memory, uint64_t bytes) override {
    std::memset(memory, 0, bytes);
    return Status::success();
  }
  std::future<Status> copyOut(const void *source, void *destination, uint64_t bytes) override {
    std::memcpy(destination, source, bytes);
    return done(Status::success());
  }
  std::future<Status> copyIn(const void *source, void *destination, uint64_t bytes) override {
    std::memcpy(destination, source, bytes);
    return done(Status::success());
  }
  Status cast(dcp::DType from, const void *source, dcp::DType to, void *destination,
              uint64_t elements) override {
    return castElements(from, source, to, destination, elements);
  }
};

/// Device memory in simulation: each allocation is a memfd mapped twice,
/// once with no access at all (the pointer handed out: any host access
/// faults) and once readable and writable for the device's own thread.
class SimulatedDevice : public MemoryBackend {
public:
  explicit SimulatedDevice(SimulatedDeviceOptions options)
      : options_(options), worker_([this] { run(); }) {}
  ~SimulatedDevice() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
    for (auto &[base, region] : regions_) {
      ::munmap(reinterpret_cast<void *>(base), region.bytes);
      ::munmap(region.inside, region.bytes);
    }
  }
  MemoryKind kind() const override { return MemoryKind::Device; }
  bool hostAccessible() const override { return false; }

  Result<void *> allocate(uint64_t bytes) override {
    if (!bytes)
      return static_cast<void *>(nullptr);
    uint64_t rounded = (bytes + 4095) / 4096 * 4096;
    int fd = ::memfd_create("fsdp-simulated-device", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(rounded)) != 0) {
      if (fd >= 0)
        ::close(fd);
      return makeError("simulated device: cannot allocate " + std::to_string(bytes) + " bytes",
                       ErrorKind::IO, ENOMEM);
    }
    void *outside = ::mmap(nullptr, rounded, PROT_NONE, MAP_SHARED, fd, 0);
    void *inside = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (outside == MAP_FAILED || inside == MAP_FAILED) {
      if (outside != MAP_FAILED)
        ::munmap(outside, rounded);
      if (inside != MAP_FAILED)
        ::munmap(inside, rounded);
      return makeError("simulated device: cannot map " + std::to_string(bytes) + " bytes",
                       ErrorKind::IO, ENOMEM);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    regions_[reinterpret_cast<uintptr_t>(outside)] = {static_cast<char *>(inside), rounded};
    return outside; // memfd pages start zeroed
  }

  void release(void *memory) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = regions_.find(reinterpret_cast<uintptr_t>(memory));
    if (found == regions_.end())
      return;
    ::munmap(memory, found->second.bytes);
    ::munmap(found->second.inside, found->second.bytes);
    regions_.erase(found);
  }

  std::future<Status> copyOut(const void *source, void *destination, uint64_t bytes) override {
    if (Status status = withinPinned(destination, bytes); !status)
      return ready(std::move(status));
    return submit([this, source, destination, bytes]() -> Status {
      Result<char *> inside = translate(source, bytes);
      if (!inside)
        return inside.failure();
      std::memcpy(destination, *inside, bytes);
      return Status::success();
    });
  }
  std::future<Status> copyIn(const void *source, void *destination, uint64_t bytes) override {
    if (Status status = withinPinned(source, bytes); !status)
      return ready(std::move(status));
    return submit([this, source, destination, bytes]() -> Status {
      Result<char *> inside = translate(destination, bytes);
      if (!inside)
        return inside.failure();
      std::memcpy(*inside, source, bytes);
      return Status::success();
    });
  }
  Status zero(void *memory, uint64_t bytes) override {
    return submit([=]() -> Status {
             Result<char *> inside = translate(memory, bytes);
             if (!inside)
               return inside.failure();
             std::memset(*inside, 0, bytes);
             return Status::success();
           })
        .get();
  }
  Status cast(dcp::DType from, const void *source, dcp::DType to, void *destination,
              uint64_t elements) override {
    return submit([=]() -> Status {
             Result<char *> in = translate(source, elements * dcp::dtypeInfo(from).elementSize);
             Result<char *> out = translate(destination, elements * dcp::dtypeInfo(to).elementSize);
             if (!in || !out)
               return !in ? Status(in.failure()) : Status(out.failure());
             return castElements(from, *in, to, *out, elements);
           })
        .get();
  }

  Status pinHostMemory(void *memory, uint64_t bytes) override {
    if (!memory || !bytes)
      return makeError("simulated device: nothing to pin", ErrorKind::InvalidArgument);
    std::lock_guard<std::mutex> lock(mutex_);
    pinned_[reinterpret_cast<uintptr_t>(memory)] = bytes;
    return Status::success();
  }
  void unpinHostMemory(void *memory, uint64_t) override {
    std::lock_guard<std::mutex> lock(mutex_);
    pinned_.erase(reinterpret_cast<uintptr_t>(memory));
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
    return submit([=]() -> Status {
             Result<char *> inside = translate(memory, count * dcp::dtypeInfo(dtype).elementSize);
             if (!inside)
               return inside.failure();
             return runtime::fillTestValues(dtype, keyHash, firstElement, count, seed, *inside);
           })
        .get();
  }
  Status checkTestValues(dcp::DType dtype, uint32_t keyHash, uint64_t firstElement, uint64_t count,
                         uint32_t seed, const void *memory) override {
    return submit([=]() -> Status {
             Result<char *> inside = translate(memory, count * dcp::dtypeInfo(dtype).elementSize);
             if (!inside)
               return inside.failure();
             return runtime::checkTestValues(dtype, keyHash, firstElement, count, seed, *inside);
           })
        .get();
  }

private:
  struct Region {
    char *inside;
    uint64_t bytes;
  };

  /// As CUDA does: host memory a copy touches must be pageable or lie within
  /// one pinned range (a copy from one registration into the next fails).
  Status withinPinned(const void *host, uint64_t bytes) const {
    auto begin = reinterpret_cast<uintptr_t>(host);
    uint64_t end = begin + bytes;
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = pinned_.upper_bound(begin);
    if (found != pinned_.begin()) {
      auto before = std::prev(found);
      if (begin < before->first + before->second)
        return end <= before->first + before->second
                   ? Status::success()
                   : makeError("simulated device: a copy of " + std::to_string(bytes) +
                                   " bytes runs past the end of pinned host memory",
                               ErrorKind::InvalidArgument);
    }
    if (found != pinned_.end() && found->first < end)
      return makeError("simulated device: a copy of " + std::to_string(bytes) +
                           " bytes runs into pinned host memory",
                       ErrorKind::InvalidArgument);
    return Status::success();
  }

  static std::future<Status> ready(Status status) {
    std::promise<Status> promise;
    promise.set_value(std::move(status));
    return promise.get_future();
  }

  /// The device thread's view of [pointer, pointer + bytes), which must lie
  /// in one allocation.
  Result<char *> translate(const void *pointer, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto address = reinterpret_cast<uintptr_t>(pointer);
    auto found = regions_.upper_bound(address);
    if (found == regions_.begin())
      return makeError("simulated device: not device memory", ErrorKind::InvalidArgument);
    --found;
    uint64_t offset = address - found->first;
    if (offset > found->second.bytes || bytes > found->second.bytes - offset)
      return makeError("simulated device: a copy past the end of an allocation",
                       ErrorKind::InvalidArgument);
    return found->second.inside + offset;
  }

  std::future<Status> submit(std::function<Status()> work) {
    auto task = std::make_shared<std::packaged_task<Status()>>(std::move(work));
    std::future<Status> result = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back([task] { (*task)(); });
    }
    wake_.notify_one();
    return result;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty())
        return; // stopping, nothing left
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      if (options_.copyDelay.count())
        std::this_thread::sleep_for(options_.copyDelay);
      work();
      lock.lock();
    }
  }

  SimulatedDeviceOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::map<uintptr_t, Region> regions_;
  std::map<uintptr_t, uint64_t> pinned_; // host memory "pinned" for this device
  std::thread worker_;
};

} // namespace

std::shared_ptr<MemoryBackend> createHostBackend() { return std::make_shared<HostBackend>(); }

StagingPool::StagingPool(uint64_t blockBytes, size_t blocks,
                         std::shared_ptr<MemoryBackend> pinner)
    : blockBytes_((std::max<uint64_t>(blockBytes, 4096) + 4095) / 4096 * 4096),
      pinner_(std::move(pinner)) {
  for (size_t i = 0; i < std::max<size_t>(blocks, 2); ++i) {
    auto *block = static_cast<char *>(std::aligned_alloc(4096, blockBytes_));
    if (!block) {
      releaseAll();
      throw std::bad_alloc();
    }
    blocks_.push_back(block);
    // Touched now, so that no save pays for the page faults.
    std::memset(block, 0, blockBytes_);
    if (pinner_ && pinner_->pinHostMemory(block, blockBytes_))
      pinned_.push_back(block);
  }
  free_ = blocks_;
}

StagingPool::~StagingPool() { releaseAll(); }

void StagingPool::releaseAll() {
  for (char *block : pinned_)
    pinner_->unpinHostMemory(block, blockBytes_);
  for (char *block : blocks_)
    std::free(block);
  pinned_.clear();
  blocks_.clear();
}

std::vector<char *> StagingPool::acquire(size_t count) {
  count = std::min(count, blocks_.size());
  std::unique_lock<std::mutex> lock(mutex_);
  freed_.wait(lock, [&] { return free_.size() >= count; });
  std::vector<char *> taken(free_.end() - static_cast<std::ptrdiff_t>(count), free_.end());
  free_.resize(free_.size() - count);
  return taken;
}

void StagingPool::release(const std::vector<char *> &blocks) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.insert(free_.end(), blocks.begin(), blocks.end());
  }
  freed_.notify_all();
}

std::shared_ptr<MemoryBackend> createSimulatedDeviceBackend(SimulatedDeviceOptions options) {
  return std::make_shared<SimulatedDevice>(options);
}

} // namespace runtime
} // namespace fsdp
