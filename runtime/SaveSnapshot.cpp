//===- SaveSnapshot.cpp - A host copy of what a save writes ---------------===//
#include "SaveSnapshot.h"
#include "fsdp/Runtime/Cast.h"
#include "Parallel.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <set>
#include <tuple>

#include <sys/mman.h>

namespace fsdp {
namespace runtime {

namespace {
constexpr uint64_t kPageBytes = 4096;
/// Copies are cut into pieces of this size, so threads share large buffers.
constexpr uint64_t kCopyPieceBytes = uint64_t(64) << 20;
constexpr uint64_t kHugePageBytes = uint64_t(2) << 20;

uint64_t roundUp(uint64_t value) { return (value + kPageBytes - 1) / kPageBytes * kPageBytes; }
} // namespace

Result<std::unique_ptr<SaveSnapshot>> SaveSnapshot::reserve(const plan::RankPlan &plan,
                                                             unsigned threads, bool hugePages,
                                                             std::shared_ptr<MemoryBackend> pinner) {
  std::unique_ptr<SaveSnapshot> snapshot(new SaveSnapshot());
  std::map<std::pair<int32_t, plan::BufferRole>, const plan::LocalBuffer *> byRole;
  for (const plan::LocalBuffer &buffer : plan.buffers)
    byRole[{buffer.group, buffer.role}] = &buffer;
  // The buffers the writes read, each resolved to the one holding memory
  // (model_weight may alias main_weight), and their ranges.
  std::set<std::pair<int32_t, plan::BufferRole>> saved;
  for (const plan::WriteItem &item : plan.writes) {
    if (item.source != plan::ItemSource::Buffer)
      continue;
    auto found = byRole.find({item.buffer.group, item.buffer.role});
    if (found == byRole.end())
      return makeError(item.key + ": this rank has no buffer group " +
                       std::to_string(item.buffer.group) + " " +
                       plan::bufferRoleName(item.buffer.role));
    const plan::LocalBuffer *buffer = found->second;
    if (buffer->aliasesMainWeight) {
      auto main = byRole.find({buffer->group, plan::BufferRole::MainWeight});
      if (main == byRole.end())
        return makeError(item.key + ": its buffer aliases a main_weight the plan does not have");
      buffer = main->second;
    }
    uint64_t elementSize = dcp::dtypeInfo(buffer->dtype).elementSize;
    if (item.buffer.localOffset < 0 || item.buffer.elements < 0 ||
        item.buffer.localOffset + item.buffer.elements > buffer->elements)
      return makeError(item.key + ": the plan reads past the end of its buffer");
    saved.insert({buffer->group, buffer->role});
    snapshot->ranges_.push_back({buffer->group, buffer->role,
                                 static_cast<uint64_t>(item.buffer.localOffset) * elementSize,
                                 static_cast<uint64_t>(item.buffer.elements) * elementSize});
  }
  // One copy per run of adjacent ranges.
  std::sort(snapshot->ranges_.begin(), snapshot->ranges_.end(), [](const Range &a, const Range &b) {
    return std::tie(a.group, a.role, a.offset) < std::tie(b.group, b.role, b.offset);
  });
  std::vector<Range> merged;
  for (const Range &range : snapshot->ranges_) {
    if (!merged.empty() && merged.back().group == range.group && merged.back().role == range.role &&
        range.offset <= merged.back().offset + merged.back().bytes) {
      Range &last = merged.back();
      last.bytes = std::max(last.offset + last.bytes, range.offset + range.bytes) - last.offset;
    } else if (range.bytes) {
      merged.push_back(range);
    }
  }
  snapshot->ranges_ = std::move(merged);

  // One block of host memory. Each saved buffer gets a page-aligned copy of
  // its size.
  plan::RankPlan layout;
  layout.rank = plan.rank;
  std::map<std::pair<int32_t, plan::BufferRole>, uint64_t> offsets;
  for (const plan::LocalBuffer &buffer : plan.buffers) {
    if (!saved.count({buffer.group, buffer.role}))
      continue;
    offsets[{buffer.group, buffer.role}] = snapshot->reserved_;
    snapshot->reserved_ +=
        roundUp(static_cast<uint64_t>(buffer.elements) * dcp::dtypeInfo(buffer.dtype).elementSize);
    layout.buffers.push_back(buffer);
  }
  // Aliases of a saved main_weight read from its copy.
  for (const plan::LocalBuffer &buffer : plan.buffers)
    if (buffer.aliasesMainWeight && saved.count({buffer.group, plan::BufferRole::MainWeight}))
      layout.buffers.push_back(buffer);
  snapshot->host_ = createHostBackend();
  if (snapshot->reserved_) {
    // Huge pages or small, faulted in now by the kernel (MADV_POPULATE_WRITE),
    // each thread a piece. Measured for 1.87 GB a rank, 2 ranks, on memory
    // the machine had not backed before: faulting in small pages and copying
    // into them stalled 0.72-0.83 s (zeroing them with memset first
    // 1.04-1.19 s, letting the copy fault them 1.22-1.65 s), huge pages
    // 2.9-5.9 s however touched; once faulted in, a 2-thread streaming copy
    // into huge pages took 0.10 s, into small ones 0.14 s.
    uint64_t alignment = hugePages ? kHugePageBytes : kPageBytes;
    snapshot->mappingBytes_ = snapshot->reserved_ + alignment - kPageBytes;
    void *mapping = ::mmap(nullptr, snapshot->mappingBytes_, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) {
      int error = errno;
      return makeError("the async save's snapshot: cannot map " +
                           std::to_string(snapshot->reserved_) +
                           " bytes of host memory: " + std::strerror(error),
                       ErrorKind::IO, error);
    }
    snapshot->mapping_ = mapping;
    uintptr_t start = reinterpret_cast<uintptr_t>(mapping);
    snapshot->memory_ = reinterpret_cast<void *>((start + alignment - 1) / alignment * alignment);
    if (hugePages) // a hint: refused, small pages serve
      (void)::madvise(snapshot->memory_, snapshot->reserved_, MADV_HUGEPAGE);
    if (Status populated = snapshot->populate(threads); !populated)
      return populated.failure();
  }
  if (pinner && snapshot->reserved_ && pinner->pinHostMemory(snapshot->memory_, snapshot->reserved_))
    snapshot->pinner_ = std::move(pinner);
  std::map<std::pair<int32_t, plan::BufferRole>, void *> views;
  for (const auto &[buffer, offset] : offsets)
    views[buffer] = static_cast<char *>(snapshot->memory_) + offset;
  Result<RankBuffers> wrapped = RankBuffers::wrap(layout, views, snapshot->host_);
  if (!wrapped)
    return wrapped.failure();
  snapshot->buffers_ = wrapped.take();
  return snapshot;
}

SaveSnapshot::~SaveSnapshot() {
  if (pinner_)
    pinner_->unpinHostMemory(memory_, reserved_);
  if (mapping_)
    ::munmap(mapping_, mappingBytes_);
}

Status SaveSnapshot::populate(unsigned threads) {
  uint64_t pieces = (reserved_ + kCopyPieceBytes - 1) / kCopyPieceBytes;
  return forEachItem(pieces, threads, [&](size_t index, unsigned) -> Status {
    char *piece = static_cast<char *>(memory_) + index * kCopyPieceBytes;
    uint64_t bytes = std::min(kCopyPieceBytes, reserved_ - index * kCopyPieceBytes);
#ifdef MADV_POPULATE_WRITE
    if (::madvise(piece, bytes, MADV_POPULATE_WRITE) == 0)
      return Status::success();
    if (int error = errno; error != EINVAL) // EINVAL: a kernel before 5.14: touched below
      return makeError("the async save's snapshot: cannot fault in " + std::to_string(bytes) +
                           " bytes of host memory: " + std::strerror(error),
                       ErrorKind::IO, error);
#endif
    // One store per page (the memory reads as zero; a zero keeps it so).
    for (uint64_t at = 0; at < bytes; at += kPageBytes)
      static_cast<volatile char *>(piece)[at] = 0;
    return Status::success();
  });
}

uint64_t SaveSnapshot::capturedBytes() const {
  uint64_t total = 0;
  for (const Range &range : ranges_)
    total += range.bytes;
  return total;
}

Status SaveSnapshot::capture(const RankBuffers &buffers, unsigned threads) {
  struct Copy {
    BufferView from, to;
    uint64_t offset, bytes;
  };
  std::vector<Copy> copies;
  for (const Range &range : ranges_) {
    Result<BufferView> from = buffers.get(range.group, range.role);
    if (!from)
      return from.failure();
    Result<BufferView> to = buffers_.get(range.group, range.role);
    if (!to)
      return to.failure();
    if (range.offset + range.bytes > from->bytes)
      return makeError("group " + std::to_string(range.group) + " " +
                           plan::bufferRoleName(range.role) +
                           ": the buffer is smaller than the plan",
                       ErrorKind::InvalidArgument);
    for (uint64_t at = 0; at < range.bytes; at += kCopyPieceBytes)
      copies.push_back(
          {*from, *to, range.offset + at, std::min(kCopyPieceBytes, range.bytes - at)});
  }
  if (buffers.backend().hostAccessible())
    return forEachItem(copies.size(), threads, [&](size_t index, unsigned) {
      const Copy &copy = copies[index];
      copyBypassingCache(static_cast<char *>(copy.to.data) + copy.offset,
                         static_cast<const char *>(copy.from.data) + copy.offset, copy.bytes);
      return Status::success();
    });
  // Device memory: every copy issued before any is waited for (the device
  // runs them back to back), then all waited for, even after a failure:
  // none may still write into the snapshot when this returns.
  std::vector<std::future<Status>> pending;
  for (const Copy &copy : copies)
    pending.push_back(
        buffers.backend().copyOut(static_cast<const char *>(copy.from.data) + copy.offset,
                                  static_cast<char *>(copy.to.data) + copy.offset, copy.bytes));
  Status first;
  for (std::future<Status> &copy : pending)
    if (Status status = copy.get(); !status && first)
      first = status;
  return first;
}

} // namespace runtime
} // namespace fsdp
