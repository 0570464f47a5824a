//===- ForwardingStorage.h - A Storage that passes every call on -*- C++ -*-===//
//
// POSIX storage under a test's hooks: a test storage derives from this and
// overrides only the operations it intercepts.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_UNITTESTS_RUNTIME_FORWARDINGSTORAGE_H
#define FSDP_UNITTESTS_RUNTIME_FORWARDINGSTORAGE_H

#include "fsdp/Runtime/Storage.h"

namespace fsdp {
namespace runtime {

class ForwardingStorage : public Storage {
public:
  ForwardingStorage() : base_(createPosixStorage()) {}
  Result<std::unique_ptr<Claim>> claim(const std::string &lock, const std::string &holder) override {
    return base_->claim(lock, holder);
  }
  Result<std::string> realPath(const std::string &path) override { return base_->realPath(path); }
  Result<std::unique_ptr<WritableFile>> create(const std::string &path) override {
    return base_->create(path);
  }
  Result<std::unique_ptr<WritableFile>> createDirect(const std::string &path) override {
    return base_->createDirect(path);
  }
  Result<std::unique_ptr<zip::ByteSource>> openRead(const std::string &path) override {
    return base_->openRead(path);
  }
  bool exists(const std::string &path) override { return base_->exists(path); }
  Result<PathStatus> status(const std::string &path) override { return base_->status(path); }
  Result<std::vector<std::string>> listDir(const std::string &path) override {
    return base_->listDir(path);
  }
  Status link(const std::string &from, const std::string &to) override {
    return base_->link(from, to);
  }
  Status setMode(const std::string &path, uint32_t mode) override {
    return base_->setMode(path, mode);
  }
  Status makeDir(const std::string &path) override { return base_->makeDir(path); }
  Status removeTree(const std::string &path) override { return base_->removeTree(path); }
  Status rename(const std::string &from, const std::string &to) override {
    return base_->rename(from, to);
  }
  Status exchange(const std::string &a, const std::string &b) override {
    return base_->exchange(a, b);
  }
  Status syncDir(const std::string &path) override { return base_->syncDir(path); }

protected:
  std::unique_ptr<Storage> base_;
};

} // namespace runtime
} // namespace fsdp

#endif // FSDP_UNITTESTS_RUNTIME_FORWARDINGSTORAGE_H
