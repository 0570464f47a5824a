//===- FileSource.cpp - A read-only file as a zip::ByteSource -------------===//
#include "fsdp/Runtime/FileSource.h"
#include "fsdp/Runtime/Cast.h"

#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>
#include <algorithm>
#include <atomic>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

namespace fsdp {
namespace runtime {

namespace {

/// ENOENT is "not found"; every other errno an I/O error that keeps it.
Error openError(const std::string &path, int error) {
  return makeError(path + ": cannot open: " + std::strerror(error),
                   error == ENOENT || error == ENOTDIR ? ErrorKind::NotFound : ErrorKind::IO,
                   error);
}

const char *fileTypeName(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode))
    return "a device";
  return "not a regular file";
}

std::string parentOf(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

/// Where a symlink at `path` leads, if that is inside its own directory.
Result<std::string> containedTarget(const std::string &path) {
  char resolved[PATH_MAX], parent[PATH_MAX];
  if (!::realpath(path.c_str(), resolved))
    return openError(path, errno);
  if (!::realpath(parentOf(path).c_str(), parent))
    return openError(path, errno);
  std::string inside = std::string(parent) + (std::string(parent) == "/" ? "" : "/");
  if (std::string(resolved).compare(0, inside.size(), inside) != 0)
    return makeError(path + ": is a symbolic link out of its directory (to " + resolved +
                         "); refused",
                     ErrorKind::Corrupt);
  return std::string(resolved);
}

} // namespace

Result<std::unique_ptr<FileSource>> FileSource::open(const std::string &path) {
  // Never block (a FIFO opened for reading waits for a writer) and never
  // follow a link out of the file's directory.
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  int fd = ::open(path.c_str(), flags | O_NOFOLLOW);
  if (fd < 0 && errno == ELOOP) {
    Result<std::string> target = containedTarget(path);
    if (!target)
      return target.failure();
    fd = ::open(target->c_str(), flags);
  }
  if (fd < 0)
    return openError(path, errno);
  struct stat info;
  if (fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    return makeError(path + ": cannot stat: " + std::strerror(error), ErrorKind::IO, error);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return makeError(path + ": is " + fileTypeName(info.st_mode) + ", not a regular file",
                     ErrorKind::Corrupt);
  }
  return std::unique_ptr<FileSource>(new FileSource(path, fd, static_cast<uint64_t>(info.st_size)));
}

FileSource::~FileSource() {
  if (mapping_)
    ::munmap(const_cast<char *>(mapping_), size_);
  ::close(fd_);
  if (directFd_ >= 0)
    ::close(directFd_);
}

void FileSource::prefetch(uint64_t offset, uint64_t count) const {
  if (offset < size_ && count)
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset),
                          static_cast<off_t>(std::min(count, size_ - offset)),
                          POSIX_FADV_WILLNEED);
}

Status FileSource::checkRange(uint64_t offset, uint64_t count) const {
  if (offset > size_ || count > size_ - offset)
    return makeError(path_ + ": read of " + std::to_string(count) + " bytes at " +
                         std::to_string(offset) + " past the end (" + std::to_string(size_) +
                         " bytes): truncated file",
                     ErrorKind::Corrupt);
  return Status::success();
}

Status FileSource::read(uint64_t offset, void *out, size_t count) const {
  if (Status status = checkRange(offset, count); !status)
    return status;
  char *cursor = static_cast<char *>(out);
  while (count > 0) {
    ssize_t got = ::pread(fd_, cursor, count, static_cast<off_t>(offset));
    if (got < 0) {
      int error = errno;
      if (error == EINTR)
        continue;
      return makeError(path_ + ": read failed at " + std::to_string(offset) + ": " +
                           std::strerror(error),
                       ErrorKind::IO, error);
    }
    if (got == 0)
      return makeError(path_ + ": unexpected end of file at " + std::to_string(offset) +
                           " (the file shrank while being read)",
                       ErrorKind::Corrupt);
    cursor += got;
    offset += static_cast<uint64_t>(got);
    count -= static_cast<size_t>(got);
  }
  return Status::success();
}

namespace {

/// Direct reads: blocks of 8 MiB, 8 in flight (measured against fio on this
/// project's disks: deeper queues and larger blocks gained nothing more).
/// Staged ranges under 16 MiB are read through the cache: the queue would
/// not fill, and each reading thread's staging is faulted in at its first
/// direct read. Ranges read in place need no staging: from 1 MiB they go
/// direct, in blocks of at least 1 MiB, at least 4 in flight where the range
/// allows.
constexpr uint64_t kDirectReadBlock = uint64_t(8) << 20;
constexpr unsigned kDirectReadDepth = 8;
constexpr uint64_t kDirectReadMinimum = uint64_t(16) << 20;
constexpr uint64_t kInPlaceReadMinimum = uint64_t(1) << 20;
constexpr uint64_t kInPlaceReadsPerRange = 4;
constexpr uint64_t kDirectAlignment = 4096;

/// Whether a read of [offset, ...) into `into` can land its whole pages in
/// place: the destination sits in its page as the range does in the file's.
bool landsInPlace(const char *into, uint64_t offset) {
  return into && (reinterpret_cast<uintptr_t>(into) - offset) % kDirectAlignment == 0;
}

/// How much of a range the page cache may lack and the range still count as
/// warm (copied out of a mapping, which faults the odd missing page in), and
/// how much it must lack to be read direct. In between, reads through the
/// cache with readahead queued (ByteSource::readBlocks) fetch only what is
/// missing: with a fifth missing, direct reads would fetch five times the
/// bytes from disk, and faulting that fifth in through a mapping runs at
/// 0.5 GB/s a rank (measured cold, against 0.6 for direct reads).
constexpr double kWarmMissingShare = 1.0 / 8, kDirectMissingShare = 3.0 / 4;
/// Copies and hashes go block by block of this size: they stay in cache.
constexpr uint64_t kConsumeBlock = uint64_t(256) << 10;

/// Each reading thread's aligned blocks, kept for its next reads (faulting
/// 64 MiB in for every item would cost more than the reads gain).
char *directBlocks() {
  thread_local std::unique_ptr<char, void (*)(void *)> blocks(nullptr, &std::free);
  if (!blocks) {
    void *memory = std::aligned_alloc(uint64_t(2) << 20, kDirectReadBlock * kDirectReadDepth);
    if (memory)
      ::madvise(memory, kDirectReadBlock * kDirectReadDepth, MADV_HUGEPAGE);
    blocks.reset(static_cast<char *>(memory));
  }
  return blocks.get();
}

/// Each reading thread's two aligned pages for the partial pages at either
/// end of a range read in place.
char *edgePages() {
  thread_local std::unique_ptr<char, void (*)(void *)> pages(
      static_cast<char *>(std::aligned_alloc(kDirectAlignment, 2 * kDirectAlignment)), &std::free);
  return pages.get();
}

/// Kernel AIO contexts (io_setup), kept for the process's next direct
/// reads: io_destroy waits out an RCU grace period (32-52 ms measured here),
/// and destroying one per item left each worker's stream idle that long
/// between items. Never freed: the kernel tears them down with the process.
class AioContextPool {
public:
  /// A context with room for kDirectReadDepth requests, or 0 where the
  /// kernel has no AIO.
  aio_context_t take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        aio_context_t context = idle_.back();
        idle_.pop_back();
        return context;
      }
    }
    aio_context_t context = 0;
    return ::syscall(SYS_io_setup, kDirectReadDepth, &context) == 0 ? context : 0;
  }
  /// Back for the next reader; only with no request in it.
  void give(aio_context_t context) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(context);
  }

private:
  std::mutex mutex_;
  std::vector<aio_context_t> idle_;
};

AioContextPool &aioContexts() {
  static AioContextPool *pool = new AioContextPool; // outlives every reading thread
  return *pool;
}

/// A pooled context in use: on every way out, it waits for the reads still
/// in flight (no read may land in a block after its reader returned) and
/// gives the context back, or destroys it where waiting failed (io_destroy
/// itself waits for them).
struct AioLease {
  aio_context_t id = aioContexts().take();
  unsigned pending = 0;
  ~AioLease() {
    if (!id)
      return;
    while (pending) {
      io_event events[kDirectReadDepth];
      long got = ::syscall(SYS_io_getevents, id, pending, kDirectReadDepth, events, nullptr);
      if (got < 0 && errno == EINTR)
        continue;
      if (got < 0) {
        ::syscall(SYS_io_destroy, id);
        return;
      }
      pending -= static_cast<unsigned>(got);
    }
    aioContexts().give(id);
  }
};

/// Cached ranges of at least this size are copied out of a mapping of the
/// file instead of by pread (the kernel's copy): measured here,
/// 4.2-5.1 GB/s against 3.3-3.4 for copy and xxh3 of a cached 1.87 GB file
/// on 2 threads.
constexpr uint64_t kMappedReadMinimum = uint64_t(1) << 20;

// A mapped page past the end of a file that shrank after it was mapped
// raises SIGBUS where pread would return short. A guarded access turns that
// into an error: its thread's jump is set while it copies and hashes, and the handler
// (installed once, ahead of whatever handler was there, which it calls for
// every other SIGBUS) jumps back.
thread_local sigjmp_buf *guardedAccessJump = nullptr;
struct sigaction previousBusAction;

void onBusError(int signal, siginfo_t *info, void *context) {
  if (guardedAccessJump)
    siglongjmp(*guardedAccessJump, 1);
  if (previousBusAction.sa_flags & SA_SIGINFO) {
    previousBusAction.sa_sigaction(signal, info, context);
  } else if (previousBusAction.sa_handler != SIG_DFL && previousBusAction.sa_handler != SIG_IGN) {
    previousBusAction.sa_handler(signal);
  } else {
    // The default action: the faulting access runs again and ends the process.
    ::signal(SIGBUS, SIG_DFL);
  }
}

/// True when the guard's handler is the process's SIGBUS handler (installed
/// here the first time). Not where a caller replaced it since: those reads
/// use pread.
bool busErrorsGuarded() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action {};
    action.sa_sigaction = onBusError;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    (void)::sigaction(SIGBUS, &action, &previousBusAction);
  });
  struct sigaction current {};
  return ::sigaction(SIGBUS, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
         current.sa_sigaction == onBusError;
}

/// Runs `access` (a copy out of a mapping, a read of it), returning false
/// instead of dying when it touches a mapped page that is gone. The jump
/// out skips the frames `access` runs: none may hold a lock or own memory
/// then (a copy, a hash: the reads of the mapping come before a cast's
/// record of what it cast).
bool guardedAccess(const std::function<void()> &access) {
  sigjmp_buf jump;
  // The signal mask is not saved (that is a system call for every block
  // copied): the jump out of the handler leaves SIGBUS blocked, and the
  // jump's landing unblocks it. It was unblocked before: a SIGBUS raised by
  // an access while blocked ends the process, handler or not.
  if (sigsetjmp(jump, 0)) {
    guardedAccessJump = nullptr;
    sigset_t bus;
    sigemptyset(&bus);
    sigaddset(&bus, SIGBUS);
    ::pthread_sigmask(SIG_UNBLOCK, &bus, nullptr);
    return false;
  }
  guardedAccessJump = &jump;
  // The handler reads the jump: the fences keep the compiler from moving
  // (or dropping) the stores across the access.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  access();
  std::atomic_signal_fence(std::memory_order_seq_cst);
  guardedAccessJump = nullptr;
  return true;
}

} // namespace

const char *FileSource::wholeMapping() const {
  std::call_once(mappedOnce_, [&] {
    // One mapping of the whole file, kept for every range: a mapping per
    // range mapped its partial 2 MiB ends page by page and unmapped it all
    // again, where the kernel maps each whole huge folio of the page cache
    // with one entry (it aligns a file mapping's address for that).
    void *address = size_ ? ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0) : MAP_FAILED;
    if (address != MAP_FAILED)
      mapping_ = static_cast<const char *>(address);
  });
  return mapping_;
}

Status FileSource::readMapped(uint64_t offset, uint64_t count, char *into,
                              const BlockConsumer &consume, const BlockCopy *copy,
                              bool &mapped) const {
  const char *file = wholeMapping();
  mapped = file != nullptr;
  if (!mapped)
    return Status::success(); // a file system that cannot map: pread reads it
  const char *bytes = file + offset; // within size_: checkRange passed
  uint64_t at = 0, size = 0;
  Status consumed = Status::success();
  // Copied with streaming stores (the copy is not read again here: a plain
  // store reads each line of it in first), and handed on from the source,
  // which the copy left in cache: copy and hash of a cached 1.87 GB file on
  // 2 threads a rank, 2 ranks at once, took 0.34-0.39 s against 0.44-0.65 s
  // with memcpy and the hash of the copy. A writer that changes the file
  // between the two fails the check (the bytes the hash read, or those
  // copied, are not the saved ones). Made once, not once a block (each
  // would allocate).
  const std::function<void()> copyAndConsume = [&] {
    if (copy)
      (*copy)(into + at, bytes + at, size);
    else
      copyBypassingCache(into + at, bytes + at, size);
    consumed = consume(at, bytes + at, size);
  };
  for (; at < count; at += kConsumeBlock) {
    size = std::min(kConsumeBlock, count - at);
    bool whole = guardedAccess(copyAndConsume);
    if (!whole)
      return makeError(path_ + ": unexpected end of file within " + std::to_string(size) +
                           " bytes at " + std::to_string(offset + at) +
                           " (the file shrank while being read)",
                       ErrorKind::Corrupt);
    mappedBytes_ += size;
    if (!consumed)
      return consumed;
  }
  return Status::success();
}

namespace {

/// cachestat(2) (Linux 6.5; Debian 12's headers predate it).
struct CacheStatRange {
  uint64_t offset, length;
};
struct CacheStat {
  uint64_t cached, dirty, writeback, evicted, recentlyEvicted;
};
constexpr long kCacheStatSyscall = 451; // the same number on every architecture

/// The pages of [offset, offset + count) in `fd`'s page cache, or nullopt
/// where the kernel cannot say. Neither way reads the file: a probing read
/// (RWF_NOWAIT) would start readahead of what it probes, and the next probe
/// would then find the range cached.
std::optional<uint64_t> cachedPages(int fd, uint64_t offset, uint64_t count, uint64_t page) {
  CacheStatRange range{offset, count};
  CacheStat stat{};
  if (::syscall(kCacheStatSyscall, fd, &range, &stat, 0) == 0)
    return stat.cached;
  // Older kernels: mincore over a mapping of the range, a window at a time
  // (for a file the caller may not write it says every page is resident:
  // the range is then taken for warm, as before there was a probe).
  constexpr uint64_t kWindow = uint64_t(64) << 20;
  std::vector<unsigned char> resident(kWindow / page);
  uint64_t cached = 0;
  for (uint64_t begin = offset / page * page; begin < offset + count; begin += kWindow) {
    uint64_t length = std::min(kWindow, offset + count - begin);
    void *mapped = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(begin));
    if (mapped == MAP_FAILED)
      return std::nullopt;
    bool known = ::mincore(mapped, length, resident.data()) == 0;
    ::munmap(mapped, length);
    if (!known)
      return std::nullopt;
    for (uint64_t at = 0; at < (length + page - 1) / page; ++at)
      cached += resident[at] & 1;
  }
  return cached;
}

} // namespace

double FileSource::missingShare(uint64_t offset, uint64_t count) const {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // Past the end of a file that shrank nothing is missing: the read says
  // the file is short, whichever way it reads.
  struct stat status {};
  if (::fstat(fd_, &status) == 0) {
    uint64_t size = status.st_size > 0 ? static_cast<uint64_t>(status.st_size) : 0;
    count = offset < size ? std::min(count, size - offset) : 0;
  }
  if (!count)
    return 0;
  uint64_t first = offset / page, pages = (offset + count + page - 1) / page - first;
  std::optional<uint64_t> cached = cachedPages(fd_, first * page, pages * page, page);
  return cached ? static_cast<double>(pages - std::min(*cached, pages)) / pages : 0;
}

bool FileSource::cold(uint64_t offset, uint64_t count) const {
  return missingShare(offset, count) > kWarmMissingShare;
}

int FileSource::directDescriptor() const {
  std::call_once(directOpened_, [&] {
    // The same open file, reopened for direct I/O: /proc names the inode
    // this source holds, not whatever stands at the path now.
    std::string self = "/proc/self/fd/" + std::to_string(fd_);
    directFd_ = ::open(self.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  });
  return directFd_;
}

Status FileSource::readBlocks(uint64_t offset, uint64_t count, char *into,
                              const BlockConsumer &consume, const BlockCopy *copy) const {
  if (Status status = checkRange(offset, count); !status)
    return status;
  if (count < kMappedReadMinimum)
    return ByteSource::readBlocks(offset, count, into, consume);
  double missing = missingShare(offset, count);
  uint64_t directMinimum = landsInPlace(into, offset) ? kInPlaceReadMinimum : kDirectReadMinimum;
  if (directAllowed_ && count >= directMinimum && missing > kDirectMissingShare) {
    if (int fd = directDescriptor(); fd >= 0)
      return readDirect(fd, offset, count, into, consume, copy);
  } else if (into && busErrorsGuarded() && missing <= kWarmMissingShare) {
    bool mapped = false;
    Status status = readMapped(offset, count, into, consume, copy, mapped);
    if (mapped)
      return status;
  }
  return ByteSource::readBlocks(offset, count, into, consume);
}

Status FileSource::readDirect(int fd, uint64_t offset, uint64_t count, char *into,
                              const BlockConsumer &consume, const BlockCopy *copy) const {
  auto alignDown = [](uint64_t at) { return at / kDirectAlignment * kDirectAlignment; };
  auto alignUp = [&](uint64_t at) { return alignDown(at + kDirectAlignment - 1); };
  uint64_t begin = alignDown(offset), end = alignUp(offset + count);
  uint64_t wholeBegin = alignUp(offset), wholeEnd = alignDown(offset + count);
  // Where the destination sits in its page as the range does in the file's
  // (our saves place each piece so: plan::pieceDataPageOffset), the whole
  // pages land in place, neither staged nor copied; the partial ones at
  // either end go through a page of their own.
  bool inPlace = wholeBegin < wholeEnd && landsInPlace(into, offset);
  struct Read {
    uint64_t at, bytes;
    char *to;     // where the read lands
    bool inPlace; // in the destination, at its own place
  };
  std::vector<Read> reads;
  if (inPlace) {
    char *edges = edgePages();
    if (!edges)
      return ByteSource::readBlocks(offset, count, into, consume);
    if (begin < wholeBegin)
      reads.push_back({begin, kDirectAlignment, edges, false});
    uint64_t block = std::clamp(alignUp((wholeEnd - wholeBegin) / kInPlaceReadsPerRange),
                                kInPlaceReadMinimum, kDirectReadBlock);
    for (uint64_t at = wholeBegin; at < wholeEnd; at += block)
      reads.push_back({at, std::min(block, wholeEnd - at), into + (at - offset), true});
    if (wholeEnd < end)
      reads.push_back({wholeEnd, kDirectAlignment, edges + kDirectAlignment, false});
  } else {
    char *blocks = directBlocks();
    if (!blocks)
      return ByteSource::readBlocks(offset, count, into, consume);
    for (uint64_t at = begin, index = 0; at < end; at += kDirectReadBlock, ++index)
      reads.push_back({at, std::min(kDirectReadBlock, end - at),
                       blocks + index % kDirectReadDepth * kDirectReadBlock, false});
  }
  AioLease context;
  if (!context.id) // no kernel AIO here: through the cache
    return ByteSource::readBlocks(offset, count, into, consume);
  auto failed = [&](const std::string &what, int error) -> Status {
    return makeError(path_ + ": " + what + ": " + std::strerror(error), ErrorKind::IO, error);
  };
  std::vector<iocb> requests(kDirectReadDepth);
  auto submit = [&](uint64_t index) -> Status {
    const Read &read = reads[index];
    iocb &request = requests[index % kDirectReadDepth];
    request = iocb{};
    request.aio_fildes = static_cast<uint32_t>(fd);
    request.aio_lio_opcode = IOCB_CMD_PREAD;
    request.aio_buf = reinterpret_cast<uint64_t>(read.to);
    request.aio_offset = static_cast<int64_t>(read.at);
    request.aio_nbytes = read.bytes;
    request.aio_data = index;
    iocb *list[1] = {&request};
    for (;;) {
      long submitted = ::syscall(SYS_io_submit, context.id, 1, list);
      if (submitted == 1) {
        ++context.pending;
        return Status::success();
      }
      if (submitted < 0 && errno == EINTR)
        continue;
      if (submitted < 0 && errno == EAGAIN) {
        std::this_thread::yield();
        continue;
      }
      return failed("direct read at " + std::to_string(read.at) + " not queued",
                    submitted < 0 ? errno : EAGAIN);
    }
  };
  for (uint64_t index = 0; index < std::min<uint64_t>(reads.size(), kDirectReadDepth); ++index)
    if (Status status = submit(index); !status)
      return status;
  // Completions arrive in any order; reads are consumed in file order.
  std::vector<int64_t> done(kDirectReadDepth, -1); // bytes read per slot, -1: pending
  for (uint64_t index = 0; index < reads.size(); ++index) {
    const Read &read = reads[index];
    size_t slot = index % kDirectReadDepth;
    while (done[slot] < 0) {
      io_event events[kDirectReadDepth];
      long got = ::syscall(SYS_io_getevents, context.id, 1, kDirectReadDepth, events, nullptr);
      if (got < 0 && errno == EINTR)
        continue;
      if (got < 0)
        return failed("waiting for direct reads", errno);
      context.pending -= static_cast<unsigned>(got);
      for (long e = 0; e < got; ++e) {
        if (events[e].res < 0)
          return failed("read failed at " + std::to_string(reads[events[e].data].at),
                        static_cast<int>(-events[e].res));
        done[events[e].data % kDirectReadDepth] = events[e].res;
      }
    }
    uint64_t from = std::max(offset, read.at);
    uint64_t to = std::min(offset + count, read.at + read.bytes);
    if (static_cast<uint64_t>(done[slot]) < to - read.at)
      return makeError(path_ + ": unexpected end of file at " +
                           std::to_string(read.at + done[slot]) +
                           " (the file shrank while being read)",
                       ErrorKind::Corrupt);
    for (uint64_t at = from; at < to; at += kConsumeBlock) {
      uint64_t size = std::min(kConsumeBlock, to - at);
      const char *piece = read.to + (at - read.at);
      if (into && !read.inPlace) {
        if (copy)
          (*copy)(into + (at - offset), piece, size);
        else
          std::memcpy(into + (at - offset), piece, size);
      }
      if (into)
        piece = into + (at - offset);
      if (Status status = consume(at - offset, piece, size); !status)
        return status;
    }
    directBytes_ += to - from;
    if (read.inPlace)
      inPlaceBytes_ += to - from;
    done[slot] = -1;
    if (index + kDirectReadDepth < reads.size())
      if (Status status = submit(index + kDirectReadDepth); !status)
        return status;
  }
  return Status::success();
}

} // namespace runtime
} // namespace fsdp
