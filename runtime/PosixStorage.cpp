//===- PosixStorage.cpp - Storage over POSIX files ------------------------===//
#include "fsdp/Runtime/FileSource.h"
#include "fsdp/Runtime/Storage.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <thread>
#include <unistd.h>

namespace fsdp {
namespace runtime {

namespace {

/// Direct writes in multiples of the page size (file systems ask for at
/// most the logical block size: 512 or 4096).
constexpr uint64_t kDirectAlignment = 4096;

Error errnoError(const std::string &path, const std::string &what, int error) {
  if (error == Fault::kKillProcess)
    ::kill(::getpid(), SIGKILL); // a crash at exactly this point
  return makeError(path + ": " + what + ": " + std::strerror(error),
                   error == ENOENT ? ErrorKind::NotFound : ErrorKind::IO, error);
}

/// An flock on an open lock file; unlinked on release so no file is left
/// behind (claimants check they locked the file still at the path).
class FileClaim : public Claim {
public:
  FileClaim(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~FileClaim() override {
    ::unlink(path_.c_str());
    ::close(fd_); // releases the lock
  }

private:
  std::string path_;
  int fd_;
};

std::string readHolder(int fd) {
  char text[512];
  ssize_t got = ::pread(fd, text, sizeof(text) - 1, 0);
  std::string holder(text, got > 0 ? static_cast<size_t>(got) : 0);
  return holder.empty() ? "a process that has not yet said who it is" : holder;
}

class PosixFile : public WritableFile {
public:
  /// Over `fd`, opened for direct I/O when `directAlignment` is not 0.
  PosixFile(std::string path, int fd, uint64_t directAlignment = 0)
      : path_(std::move(path)), fd_(fd), directAlignment_(directAlignment) {}
  ~PosixFile() override {
    if (fd_ >= 0)
      ::close(fd_);
  }
  const std::string &path() const override { return path_; }

  Status writeAt(uint64_t offset, const std::vector<ByteSpan> &spans) override {
    std::vector<iovec> iov;
    for (const ByteSpan &span : spans)
      if (span.size)
        iov.push_back({const_cast<void *>(span.data), span.size});
    size_t next = 0;
    while (next < iov.size()) {
      int count = static_cast<int>(std::min<size_t>(iov.size() - next, IOV_MAX));
      ssize_t wrote = ::pwritev(fd_, iov.data() + next, count, static_cast<off_t>(offset));
      if (wrote < 0) {
        if (errno == EINTR)
          continue;
        return errnoError(path_, "write at " + std::to_string(offset) + " failed", errno);
      }
      if (wrote == 0)
        return errnoError(path_, "write made no progress", ENOSPC);
      offset += static_cast<uint64_t>(wrote);
      // Advance past what was written, possibly inside one iovec.
      size_t left = static_cast<size_t>(wrote);
      while (left > 0 && next < iov.size()) {
        if (left >= iov[next].iov_len) {
          left -= iov[next].iov_len;
          ++next;
        } else {
          iov[next].iov_base = static_cast<char *>(iov[next].iov_base) + left;
          iov[next].iov_len -= left;
          left = 0;
        }
      }
    }
    return Status::success();
  }

  Status sync() override {
    if (::fsync(fd_) != 0)
      return errnoError(path_, "fsync failed", errno);
    return Status::success();
  }

  uint64_t directAlignment() const override { return directAlignment_; }

  Status truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
      return errnoError(path_, "cannot set the size to " + std::to_string(size), errno);
    return Status::success();
  }

  Status reserve(uint64_t size) override {
    if (!size || ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)) == 0)
      return Status::success();
    if (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL)
      return Status::success(); // a file system that cannot: the hint is dropped
    return errnoError(path_, "cannot reserve " + std::to_string(size) + " bytes", errno);
  }

  Status close() override {
    int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && ::close(fd) != 0)
      return errnoError(path_, "close failed", errno);
    return Status::success();
  }

private:
  std::string path_;
  int fd_;
  uint64_t directAlignment_;
};

class PosixStorage : public Storage {
public:
  Result<std::unique_ptr<Claim>> claim(const std::string &lockPath,
                                       const std::string &holder) override {
    for (int attempt = 0; attempt < 100; ++attempt) {
      int fd = ::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
      if (fd < 0)
        return errnoError(lockPath, "cannot create the lock file", errno);
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int error = errno;
        std::string current = error == EWOULDBLOCK ? readHolder(fd) : "";
        ::close(fd);
        if (error == EWOULDBLOCK)
          return makeError(lockPath + ": busy: another save holds this target (" + current + ")",
                           ErrorKind::Busy);
        return errnoError(lockPath, "cannot lock", error);
      }
      // The previous holder may have unlinked the file between our open and
      // our lock: then we hold a lock nobody else can see; try again.
      struct stat opened, named;
      // Only a lock file of ours is truncated and written: a hard link to some
      // other file (or a device) planted at the lock's name is refused.
      if (::fstat(fd, &opened) == 0 && (!S_ISREG(opened.st_mode) || opened.st_nlink > 1)) {
        ::close(fd);
        return makeError(lockPath + ": not a lock file of ours (" +
                             (S_ISREG(opened.st_mode) ? "a file with other links"
                                                      : "not a regular file") +
                             "): remove it if no save is running",
                         ErrorKind::InvalidArgument);
      }
      if (::fstat(fd, &opened) == 0 && ::stat(lockPath.c_str(), &named) == 0 &&
          opened.st_ino == named.st_ino && opened.st_dev == named.st_dev) {
        if (::ftruncate(fd, 0) == 0) {
          ssize_t wrote = ::pwrite(fd, holder.data(), holder.size(), 0);
          (void)wrote; // the description is informational only
        }
        return std::unique_ptr<Claim>(new FileClaim(lockPath, fd));
      }
      ::close(fd);
    }
    return makeError(lockPath + ": busy: the lock file keeps changing hands", ErrorKind::Busy);
  }
  Result<std::string> realPath(const std::string &path) override {
    char resolved[PATH_MAX];
    if (!::realpath(path.c_str(), resolved))
      return errnoError(path, "cannot resolve", errno);
    return std::string(resolved);
  }
  Result<std::unique_ptr<WritableFile>> create(const std::string &path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      return errnoError(path, "cannot create", errno);
    return std::unique_ptr<WritableFile>(new PosixFile(path, fd));
  }
  Result<std::unique_ptr<WritableFile>> createDirect(const std::string &path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    // A file system without direct I/O (EINVAL: ramfs, some FUSE) gets a
    // plain file.
    if (fd < 0 && errno == EINVAL)
      return create(path);
    if (fd < 0)
      return errnoError(path, "cannot create", errno);
    return std::unique_ptr<WritableFile>(new PosixFile(path, fd, kDirectAlignment));
  }
  Result<std::unique_ptr<zip::ByteSource>> openRead(const std::string &path) override {
    Result<std::unique_ptr<FileSource>> file = FileSource::open(path);
    if (!file)
      return file.failure();
    return std::unique_ptr<zip::ByteSource>(file.take());
  }
  bool exists(const std::string &path) override {
    struct stat info;
    return ::lstat(path.c_str(), &info) == 0;
  }
  Result<PathStatus> status(const std::string &path) override {
    struct stat info;
    PathStatus out;
    if (::lstat(path.c_str(), &info) != 0) {
      if (errno == ENOENT)
        return out;
      return errnoError(path, "cannot stat", errno);
    }
    out.kind = S_ISDIR(info.st_mode)   ? PathStatus::Kind::Directory
               : S_ISREG(info.st_mode) ? PathStatus::Kind::RegularFile
               : S_ISLNK(info.st_mode) ? PathStatus::Kind::Link
                                       : PathStatus::Kind::Other;
    out.mode = info.st_mode & 07777;
    out.device = info.st_dev;
    out.inode = info.st_ino;
    return out;
  }
  Result<std::string> readLink(const std::string &path) override {
    char target[PATH_MAX];
    ssize_t length = ::readlink(path.c_str(), target, sizeof target);
    if (length < 0)
      return errnoError(path, "cannot read the link", errno);
    if (static_cast<size_t>(length) >= sizeof target)
      return errnoError(path, "cannot read the link", ENAMETOOLONG);
    return std::string(target, static_cast<size_t>(length));
  }
  Result<std::vector<std::string>> listDir(const std::string &path) override {
    DIR *dir = ::opendir(path.c_str());
    if (!dir)
      return errnoError(path, "cannot open directory", errno);
    std::vector<std::string> names;
    while (dirent *entry = ::readdir(dir)) {
      std::string name = entry->d_name;
      if (name != "." && name != "..")
        names.push_back(name);
    }
    ::closedir(dir);
    return names;
  }
  Status link(const std::string &existing, const std::string &name) override {
    if (::link(existing.c_str(), name.c_str()) != 0)
      return errnoError(existing, "cannot link to " + name, errno);
    return Status::success();
  }
  Status setMode(const std::string &path, uint32_t mode) override {
    if (::chmod(path.c_str(), mode) != 0)
      return errnoError(path, "cannot set the mode", errno);
    return Status::success();
  }
  Status makeDir(const std::string &path) override {
    if (::mkdir(path.c_str(), 0755) != 0)
      return errnoError(path, "cannot create directory", errno);
    return Status::success();
  }
  Status removeTree(const std::string &path) override {
    struct stat info;
    if (::lstat(path.c_str(), &info) != 0)
      return errno == ENOENT ? Status::success() : Status(errnoError(path, "cannot stat", errno));
    if (S_ISDIR(info.st_mode)) {
      Result<std::vector<std::string>> names = listDir(path);
      if (!names)
        return names.failure();
      for (const std::string &name : *names)
        if (Status status = removeTree(path + "/" + name); !status)
          return status;
      if (::rmdir(path.c_str()) != 0)
        return errnoError(path, "cannot remove directory", errno);
      return Status::success();
    }
    if (::unlink(path.c_str()) != 0)
      return errnoError(path, "cannot remove", errno);
    return Status::success();
  }
  Status rename(const std::string &from, const std::string &to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return errnoError(from, "cannot rename to " + to, errno);
    return Status::success();
  }
  Status exchange(const std::string &a, const std::string &b) override {
    if (::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0)
      return errnoError(a, "cannot exchange with " + b, errno);
    return Status::success();
  }
  Status syncDir(const std::string &path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
      return errnoError(path, "cannot open directory", errno);
    int result = ::fsync(fd);
    int error = errno;
    ::close(fd);
    if (result != 0)
      return errnoError(path, "fsync of directory failed", error);
    return Status::success();
  }
};

/// True when this call is the one the fault names; a pause sleeps here and
/// lets the call through.
bool fires(const Fault &fault, Fault::Op op, std::atomic<int> &count) {
  if (fault.op != op || ++count != fault.nth)
    return false;
  if (fault.error != Fault::kPause)
    return true;
  std::this_thread::sleep_for(std::chrono::seconds(Fault::kPauseSeconds));
  return false;
}

class FaultyFile : public WritableFile {
public:
  FaultyFile(std::unique_ptr<WritableFile> base, Fault fault, std::atomic<int> &writes,
             std::atomic<int> &syncs)
      : base_(std::move(base)), fault_(fault), writes_(writes), syncs_(syncs) {}
  const std::string &path() const override { return base_->path(); }
  Status writeAt(uint64_t offset, const std::vector<ByteSpan> &spans) override {
    if (fires(fault_, Fault::Op::Write, writes_))
      return errnoError(path(), "write at " + std::to_string(offset) + " failed (injected)",
                        fault_.error);
    return base_->writeAt(offset, spans);
  }
  Status sync() override {
    if (fires(fault_, Fault::Op::Sync, syncs_))
      return errnoError(path(), "fsync failed (injected)", fault_.error);
    return base_->sync();
  }
  Status close() override { return base_->close(); }
  uint64_t directAlignment() const override { return base_->directAlignment(); }
  Status truncate(uint64_t size) override { return base_->truncate(size); }
  Status reserve(uint64_t size) override { return base_->reserve(size); }

private:
  std::unique_ptr<WritableFile> base_;
  Fault fault_;
  std::atomic<int> &writes_; // shared by every file of the storage; writers
  std::atomic<int> &syncs_;  // may be several threads
};

class FaultInjectingStorage : public Storage {
public:
  FaultInjectingStorage(std::unique_ptr<Storage> base, Fault fault)
      : base_(std::move(base)), fault_(fault) {}
  Result<std::unique_ptr<WritableFile>> create(const std::string &path) override {
    if (fires(fault_, Fault::Op::Create, creates_))
      return errnoError(path, "cannot create (injected)", fault_.error);
    Result<std::unique_ptr<WritableFile>> file = base_->create(path);
    if (!file)
      return file;
    return std::unique_ptr<WritableFile>(new FaultyFile(file.take(), fault_, writes_, syncs_));
  }
  Result<std::unique_ptr<WritableFile>> createDirect(const std::string &path) override {
    if (fires(fault_, Fault::Op::Create, creates_))
      return errnoError(path, "cannot create (injected)", fault_.error);
    Result<std::unique_ptr<WritableFile>> file = base_->createDirect(path);
    if (!file)
      return file;
    return std::unique_ptr<WritableFile>(new FaultyFile(file.take(), fault_, writes_, syncs_));
  }
  Result<std::unique_ptr<zip::ByteSource>> openRead(const std::string &path) override {
    return base_->openRead(path);
  }
  Result<std::unique_ptr<Claim>> claim(const std::string &lockPath,
                                       const std::string &holder) override {
    return base_->claim(lockPath, holder);
  }
  Result<std::string> realPath(const std::string &path) override { return base_->realPath(path); }
  bool exists(const std::string &path) override { return base_->exists(path); }
  Result<PathStatus> status(const std::string &path) override { return base_->status(path); }
  Result<std::string> readLink(const std::string &path) override { return base_->readLink(path); }
  Result<std::vector<std::string>> listDir(const std::string &path) override {
    return base_->listDir(path);
  }
  Status link(const std::string &existing, const std::string &name) override {
    return base_->link(existing, name);
  }
  Status setMode(const std::string &path, uint32_t mode) override {
    return base_->setMode(path, mode);
  }
  Status makeDir(const std::string &path) override { return base_->makeDir(path); }
  Status removeTree(const std::string &path) override { return base_->removeTree(path); }
  Status rename(const std::string &from, const std::string &to) override {
    if (fires(fault_, Fault::Op::Rename, renames_))
      return errnoError(from, "cannot rename to " + to + " (injected)", fault_.error);
    return base_->rename(from, to);
  }
  Status exchange(const std::string &a, const std::string &b) override {
    if (fires(fault_, Fault::Op::Rename, renames_))
      return errnoError(a, "cannot exchange with " + b + " (injected)", fault_.error);
    return base_->exchange(a, b);
  }
  Status syncDir(const std::string &path) override { return base_->syncDir(path); }

private:
  std::unique_ptr<Storage> base_;
  Fault fault_;
  std::atomic<int> writes_{0}, syncs_{0}, creates_{0}, renames_{0};
};

} // namespace

std::unique_ptr<Storage> createPosixStorage() { return std::make_unique<PosixStorage>(); }

std::unique_ptr<Storage> createFaultInjectingStorage(std::unique_ptr<Storage> base, Fault fault) {
  return std::make_unique<FaultInjectingStorage>(std::move(base), fault);
}

Result<Fault> parseFault(const std::string &text) {
  Fault fault;
  size_t first = text.find(':'), second = text.find(':', first + 1);
  if (first == std::string::npos || second == std::string::npos)
    return makeError("fault '" + text + "': expected OP:N:ERRNO, e.g. write:3:EIO");
  std::string op = text.substr(0, first), nth = text.substr(first + 1, second - first - 1),
              error = text.substr(second + 1);
  if (op == "write")
    fault.op = Fault::Op::Write;
  else if (op == "sync")
    fault.op = Fault::Op::Sync;
  else if (op == "create")
    fault.op = Fault::Op::Create;
  else if (op == "rename")
    fault.op = Fault::Op::Rename;
  else
    return makeError("fault '" + text + "': unknown operation '" + op +
                     "' (write, sync, create, rename)");
  char *end = nullptr;
  long n = std::strtol(nth.c_str(), &end, 10);
  if (nth.empty() || *end || n < 1)
    return makeError("fault '" + text + "': N must be a positive integer");
  fault.nth = static_cast<int>(n);
  if (error == "EIO")
    fault.error = EIO;
  else if (error == "ENOSPC")
    fault.error = ENOSPC;
  else if (error == "EACCES")
    fault.error = EACCES;
  else if (error == "KILL")
    fault.error = Fault::kKillProcess;
  else if (error == "PAUSE")
    fault.error = Fault::kPause;
  else
    return makeError("fault '" + text + "': unknown errno '" + error +
                     "' (EIO, ENOSPC, EACCES, KILL or PAUSE)");
  return fault;
}

} // namespace runtime
} // namespace fsdp
