//===- FileSource.cpp - A read-only file as a zip::ByteSource -------------===//
#include "fsdp/Runtime/FileSource.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace fsdp {
namespace runtime {

Result<std::unique_ptr<FileSource>> FileSource::open(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return makeError(path + ": cannot open: " + std::strerror(errno));
  struct stat info;
  if (fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    return makeError(path + ": cannot stat: " + std::strerror(error));
  }
  return std::unique_ptr<FileSource>(
      new FileSource(path, fd, static_cast<uint64_t>(info.st_size)));
}

FileSource::~FileSource() { ::close(fd_); }

Status FileSource::read(uint64_t offset, void *out, size_t count) const {
  if (offset > size_ || count > size_ - offset)
    return makeError(path_ + ": read of " + std::to_string(count) + " bytes at " +
                     std::to_string(offset) + " past the end (" + std::to_string(size_) +
                     " bytes): truncated file");
  char *cursor = static_cast<char *>(out);
  while (count > 0) {
    ssize_t got = ::pread(fd_, cursor, count, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR)
        continue;
      return makeError(path_ + ": read failed at " + std::to_string(offset) + ": " +
                       std::strerror(errno));
    }
    if (got == 0)
      return makeError(path_ + ": unexpected end of file at " + std::to_string(offset));
    cursor += got;
    offset += static_cast<uint64_t>(got);
    count -= static_cast<size_t>(got);
  }
  return Status::success();
}

Result<std::string> readWholeFile(const std::string &path, uint64_t maxBytes) {
  Result<std::unique_ptr<FileSource>> file = FileSource::open(path);
  if (!file)
    return file.failure();
  if ((*file)->size() > maxBytes)
    return makeError(path + ": " + std::to_string((*file)->size()) +
                     " bytes is more than this reader accepts");
  std::string bytes((*file)->size(), '\0');
  if (Status status = (*file)->read(0, bytes.data(), bytes.size()); !status)
    return status.failure();
  return bytes;
}

} // namespace runtime
} // namespace fsdp
