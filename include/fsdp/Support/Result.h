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
#include <optional>
#include <string>
#include <utility>

namespace fsdp {

/// An error message, tagged so that Result<std::string> stays unambiguous.
struct Error {
  std::string message;
};

inline Error makeError(std::string message) { return Error{std::move(message)}; }

template <typename T> class [[nodiscard]] Result {
public:
  Result(T value) : value_(std::move(value)) {}
  Result(Error error) : error_(std::move(error.message)) {}

  explicit operator bool() const { return value_.has_value(); }
  bool ok() const { return value_.has_value(); }

  T &operator*() { assert(ok()); return *value_; }
  const T &operator*() const { assert(ok()); return *value_; }
  T *operator->() { assert(ok()); return &*value_; }
  const T *operator->() const { assert(ok()); return &*value_; }
  T take() { assert(ok()); return std::move(*value_); }

  const std::string &error() const { assert(!ok()); return error_; }

private:
  std::optional<T> value_;
  std::string error_;
};

/// Result of an operation that yields nothing but may fail.
class [[nodiscard]] Status {
public:
  Status() = default;
  Status(Error error) : error_(std::move(error.message)), failed_(true) {}
  static Status success() { return Status(); }

  explicit operator bool() const { return !failed_; }
  bool ok() const { return !failed_; }
  const std::string &error() const { return error_; }

private:
  std::string error_;
  bool failed_ = false;
};

} // namespace fsdp

#endif // FSDP_SUPPORT_RESULT_H
