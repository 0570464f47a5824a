//===- FileSource.h - A read-only file as a zip::ByteSource ----*- C++ -*-===//
#ifndef FSDP_RUNTIME_FILESOURCE_H
#define FSDP_RUNTIME_FILESOURCE_H

#include "fsdp/Format/Zip.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

namespace fsdp {
namespace runtime {

/// pread-backed bytes of one file; errors name the file.
class FileSource : public zip::ByteSource {
public:
  static Result<std::unique_ptr<FileSource>> open(const std::string &path);
  ~FileSource() override;
  uint64_t size() const override { return size_; }
  Status read(uint64_t offset, void *out, size_t count) const override;
  /// posix_fadvise(WILLNEED): the kernel queues the reads and returns.
  void prefetch(uint64_t offset, uint64_t count) const override;
  /// A large range the page cache mostly lacks is read with direct I/O,
  /// a deep queue of aligned blocks in flight (what the device needs to
  /// reach its rate); a cached one (into a destination, 1 MiB or more) is
  /// copied out of a mapping of the file, faster than the kernel's copy; the
  /// rest (partly cached ones too) through the cache, as the base does. A
  /// file that shrinks meanwhile is an error in every case.
  Status readBlocks(uint64_t offset, uint64_t count, char *into, const BlockConsumer &consume,
                    const BlockCopy *copy = nullptr) const override;
  /// Off: no direct reads, every range through the cache or a mapping.
  void allowDirectReads(bool allowed) override { directAllowed_ = allowed; }
  /// More than an eighth of the range's pages missing from the cache.
  bool cold(uint64_t offset, uint64_t count) const override;
  /// The share of the range's pages the page cache lacks, counted without
  /// reading (0 where the kernel cannot say; pages past the end of the
  /// file do not count).
  double missingShare(uint64_t offset, uint64_t count) const;
  const std::string &path() const { return path_; }
  /// Bytes this source has read with direct I/O so far.
  uint64_t directBytes() const { return directBytes_; }
  /// Of those, bytes that landed straight in the caller's memory (neither
  /// staged nor copied).
  uint64_t inPlaceBytes() const override { return inPlaceBytes_; }
  /// Bytes this source has copied out of a mapping so far.
  uint64_t mappedBytes() const { return mappedBytes_; }

private:
  FileSource(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  /// The file reopened for direct I/O; -1 where that cannot be.
  int directDescriptor() const;
  Status readDirect(int fd, uint64_t offset, uint64_t count, char *into,
                    const BlockConsumer &consume, const BlockCopy *copy) const;
  /// The whole file (as long as it was at open) mapped read-only, made at
  /// the first call; nullptr where it cannot be mapped.
  const char *wholeMapping() const;
  /// `mapped` false: the file could not be mapped and nothing was read.
  Status readMapped(uint64_t offset, uint64_t count, char *into, const BlockConsumer &consume,
                    const BlockCopy *copy, bool &mapped) const;
  Status checkRange(uint64_t offset, uint64_t count) const;
  std::string path_;
  int fd_;
  uint64_t size_;
  mutable std::once_flag directOpened_, mappedOnce_;
  mutable const char *mapping_ = nullptr;
  mutable int directFd_ = -1;
  bool directAllowed_ = true;
  mutable std::atomic<uint64_t> directBytes_{0};
  mutable std::atomic<uint64_t> inPlaceBytes_{0};
  mutable std::atomic<uint64_t> mappedBytes_{0};
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_FILESOURCE_H
