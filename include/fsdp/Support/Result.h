//===- Result.h - Value-or-error results for the non-MLIR libraries -------===//
//
// lib/Layout and lib/Format are linked both into MLIR code (built with
// -fno-exceptions) and into the runtime, so they never throw: fallible calls
// return a Result<T> holding either a value or a one-line error message.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_SUPPORT_RESULT_H
#define FSDP_SUPPORT_RESULT_H

#include <cassert>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace fsdp {

/// What kind of failure an error is: callers act on it (retry a busy
/// target, report a corrupt file) and the tools exit with a code per kind
/// (docs/Errors.md lists them).
enum class ErrorKind : uint8_t {
  Internal,        // a bug or an unclassified failure (out of memory)
  InvalidArgument, // a bad option, value or call
  NotFound,        // no such file, key or committed checkpoint
  Corrupt,         // checksum mismatch, truncated or malformed file
  Incompatible,    // well-formed but not what the plan expects (key, shape, dtype, coverage)
  IO,              // the operating system refused (errno kept)
  Busy,            // another save holds the target
};

/// The stable name of a kind ("corrupt").
inline const char *errorKindName(ErrorKind kind) {
  switch (kind) {
  case ErrorKind::InvalidArgument:
    return "invalid argument";
  case ErrorKind::NotFound:
    return "not found";
  case ErrorKind::Corrupt:
    return "corrupt";
  case ErrorKind::Incompatible:
    return "incompatible";
  case ErrorKind::IO:
    return "I/O error";
  case ErrorKind::Busy:
    return "busy";
  case ErrorKind::Internal:
    break;
  }
  return "failed";
}

/// The exit code of the tools (and the C API's return code) for a kind:
/// 1 failed (anything else), 2 invalid argument, 3 not found, 4 corrupt,
/// 5 incompatible, 6 I/O error, 7 busy.
constexpr int errorKindExitCode(ErrorKind kind) {
  switch (kind) {
  case ErrorKind::InvalidArgument:
    return 2;
  case ErrorKind::NotFound:
    return 3;
  case ErrorKind::Corrupt:
    return 4;
  case ErrorKind::Incompatible:
    return 5;
  case ErrorKind::IO:
    return 6;
  case ErrorKind::Busy:
    return 7;
  case ErrorKind::Internal:
    break;
  }
  return 1;
}

/// An error message with its kind (and errno for I/O errors), tagged so that
/// Result<std::string> stays unambiguous.
struct Error {
  std::string message;
  ErrorKind kind = ErrorKind::Internal;
  int errnum = 0;
};

inline Error makeError(std::string message, ErrorKind kind = ErrorKind::Internal, int errnum = 0) {
  return Error{std::move(message), kind, errnum};
}

template <typename T> class [[nodiscard]] Result {
public:
  Result(T value) : value_(std::move(value)) {}
  Result(Error error) : error_(std::move(error)) {}

  explicit operator bool() const { return value_.has_value(); }
  bool ok() const { return value_.has_value(); }

  T &operator*() {
    assert(ok());
    return *value_;
  }
  const T &operator*() const {
    assert(ok());
    return *value_;
  }
  T *operator->() {
    assert(ok());
    return &*value_;
  }
  const T *operator->() const {
    assert(ok());
    return &*value_;
  }
  T take() {
    assert(ok());
    return std::move(*value_);
  }

  const std::string &error() const {
    assert(!ok());
    return error_.message;
  }
  ErrorKind kind() const { return error_.kind; }
  /// The whole error, to pass on unchanged.
  const Error &failure() const {
    assert(!ok());
    return error_;
  }

private:
  std::optional<T> value_;
  Error error_;
};

/// Result of an operation that yields nothing but may fail.
class [[nodiscard]] Status {
public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}
  static Status success() { return Status(); }

  explicit operator bool() const { return !failed_; }
  bool ok() const { return !failed_; }
  const std::string &error() const { return error_.message; }
  ErrorKind kind() const { return error_.kind; }
  const Error &failure() const { return error_; }

private:
  Error error_;
  bool failed_ = false;
};

/// A new message for a failure, keeping its kind and errno: what every layer
/// that adds context (a path, a key) uses.
template <typename Failed> Error propagate(const Failed &failed, std::string message) {
  Error error = failed.failure();
  error.message = std::move(message);
  return error;
}

/// The failure with a default kind for errors no layer classified (a
/// format's parse error read from a file is corrupt).
template <typename Failed>
Error classify(const Failed &failed, std::string message, ErrorKind kindIfUnclassified) {
  Error error = propagate(failed, std::move(message));
  if (error.kind == ErrorKind::Internal)
    error.kind = kindIfUnclassified;
  return error;
}

} // namespace fsdp

#endif // FSDP_SUPPORT_RESULT_H
