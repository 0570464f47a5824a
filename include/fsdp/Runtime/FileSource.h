//===- FileSource.h - A read-only file as a zip::ByteSource ----*- C++ -*-===//
#ifndef FSDP_RUNTIME_FILESOURCE_H
#define FSDP_RUNTIME_FILESOURCE_H

#include "fsdp/Format/Zip.h"

#include <memory>
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
  const std::string &path() const { return path_; }

private:
  FileSource(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_;
  uint64_t size_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_FILESOURCE_H
