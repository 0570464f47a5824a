//===- Storage.h - File-system operations the runtime uses -----*- C++ -*-===//
//
// One small interface for every file-system effect of a save or load, so
// tests can inject faults (EIO on the Nth write, ENOSPC) without a broken
// disk, and so other back ends (O_DIRECT, io_uring) can slot in where a
// measurement shows they pay. Errors name the path and the errno text.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_STORAGE_H
#define FSDP_RUNTIME_STORAGE_H

#include "fsdp/Format/Zip.h"
#include "fsdp/Support/Result.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {
namespace runtime {

/// A contiguous piece of bytes to write.
struct ByteSpan {
  const void *data;
  size_t size;
};

class WritableFile {
public:
  virtual ~WritableFile() = default;
  /// Writes `spans` back to back starting at `offset` (all of them or an error).
  virtual Status writeAt(uint64_t offset, const std::vector<ByteSpan> &spans) = 0;
  virtual Status sync() = 0;
  virtual Status close() = 0;
  virtual const std::string &path() const = 0;
  /// Non-zero for a file opened for direct I/O (O_DIRECT): every write's
  /// offset, length and memory must then be multiples of this.
  virtual uint64_t directAlignment() const { return 0; }
  /// Sets the file's size (direct writes end on a whole block).
  virtual Status truncate(uint64_t size) = 0;
  /// Reserves the disk blocks of [0, size) before the writes, without
  /// changing the file's size, so that writes landing in any order leave
  /// few extents (reads of the file run faster). A hint: file systems that
  /// cannot reserve ignore it.
  virtual Status reserve(uint64_t size) {
    (void)size;
    return Status::success();
  }
};

/// An exclusive claim on a path, held until destroyed.
class Claim {
public:
  virtual ~Claim() = default;
};

/// What stands at a path, the path itself (a final link not followed).
struct PathStatus {
  enum class Kind { Missing, Directory, RegularFile, Link, Other } kind = Kind::Missing;
  uint32_t mode = 0; // permission bits
  uint64_t device = 0, inode = 0;
};

class Storage {
public:
  virtual ~Storage() = default;
  /// Claims `lockPath` (created if missing) for this process until the claim
  /// is destroyed: an flock, so the claim of a process that dies ends with
  /// it. `holder` describes the claimant; a second claim fails at once with
  /// a busy error naming the holder.
  virtual Result<std::unique_ptr<Claim>> claim(const std::string &lockPath,
                                               const std::string &holder) = 0;
  /// The canonical absolute form of an existing path (links, `.`, `..`).
  virtual Result<std::string> realPath(const std::string &path) = 0;
  /// Creates (truncating) a file for writing.
  virtual Result<std::unique_ptr<WritableFile>> create(const std::string &path) = 0;
  /// The same for direct I/O where the file system takes it (bypassing the
  /// page cache: measured faster for large writes); a plain file elsewhere.
  virtual Result<std::unique_ptr<WritableFile>> createDirect(const std::string &path) {
    return create(path);
  }
  /// Opens a regular file for reading, never blocking (a FIFO is refused,
  /// not waited on) and never following a link out of the file's directory.
  virtual Result<std::unique_ptr<zip::ByteSource>> openRead(const std::string &path) = 0;
  virtual bool exists(const std::string &path) = 0;
  virtual Result<PathStatus> status(const std::string &path) = 0;
  /// What a symbolic link at `path` holds, unresolved (readlink). Storage
  /// that has no links says so.
  virtual Result<std::string> readLink(const std::string &path) {
    return makeError(path + ": symbolic links cannot be read through this storage",
                     ErrorKind::InvalidArgument);
  }
  /// The names in a directory (without `.` and `..`).
  virtual Result<std::vector<std::string>> listDir(const std::string &path) = 0;
  /// A second name for an existing file (a hard link).
  virtual Status link(const std::string &existing, const std::string &name) = 0;
  /// Sets a path's permission bits.
  virtual Status setMode(const std::string &path, uint32_t mode) = 0;
  virtual Status makeDir(const std::string &path) = 0;
  /// Removes a file or a directory tree; a missing path is not an error.
  virtual Status removeTree(const std::string &path) = 0;
  virtual Status rename(const std::string &from, const std::string &to) = 0;
  /// Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE).
  virtual Status exchange(const std::string &a, const std::string &b) = 0;
  /// Makes a directory's entries durable (fsync on the directory).
  virtual Status syncDir(const std::string &path) = 0;
};

std::unique_ptr<Storage> createPosixStorage();

/// Fails the `nth` (1-based) call of one operation with `error` (an errno
/// value), then behaves normally: what the EIO/ENOSPC tests use. With
/// kKillProcess the process SIGKILLs itself there instead: the crash tests.
/// With kPause it sleeps kPauseSeconds there and goes on: the tests of two
/// saves at once.
struct Fault {
  static constexpr int kKillProcess = -1;
  static constexpr int kPause = -2;
  static constexpr int kPauseSeconds = 4;
  enum class Op { Write, Sync, Create, Rename } op = Op::Write;
  int nth = 1;
  int error = 5; // EIO
};
std::unique_ptr<Storage> createFaultInjectingStorage(std::unique_ptr<Storage> base, Fault fault);

/// Parses "write:3:EIO", "sync:1:ENOSPC", "create:2:EACCES", "rename:1:EIO",
/// "write:5:KILL", "write:1:PAUSE".
Result<Fault> parseFault(const std::string &text);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_STORAGE_H
