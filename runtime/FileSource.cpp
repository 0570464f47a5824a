//===- FileSource.cpp - A read-only file as a zip::ByteSource -------------===//
#include "fsdp/Runtime/FileSource.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <fcntl.h>
#include <sys/stat.h>
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

FileSource::~FileSource() { ::close(fd_); }

void FileSource::prefetch(uint64_t offset, uint64_t count) const {
  if (offset < size_ && count)
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset),
                          static_cast<off_t>(std::min(count, size_ - offset)),
                          POSIX_FADV_WILLNEED);
}

Status FileSource::read(uint64_t offset, void *out, size_t count) const {
  if (offset > size_ || count > size_ - offset)
    return makeError(path_ + ": read of " + std::to_string(count) + " bytes at " +
                         std::to_string(offset) + " past the end (" + std::to_string(size_) +
                         " bytes): truncated file",
                     ErrorKind::Corrupt);
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

} // namespace runtime
} // namespace fsdp
