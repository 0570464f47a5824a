//===- RuntimeSupport.cpp - Helpers shared by save, load and verify -------===//
#include "RuntimeSupport.h"

#include <ctime>
#include <unistd.h>

namespace fsdp {
namespace runtime {

Result<const zip::ItemLayout *> ItemLayoutCache::get(dcp::DType dtype, const dcp::Dims &sizes) {
  auto &slot = layouts_[{dtype, sizes}];
  if (!slot) {
    Result<zip::ItemLayout> layout = zip::planContiguousTensorItem(dtype, sizes);
    if (!layout)
      return layout.failure();
    slot = std::make_unique<zip::ItemLayout>(layout.take());
  }
  return slot.get();
}

std::string itemChecksumKey(const std::string &key, const dcp::Dims &offsets, bool isTensor) {
  if (!isTensor)
    return key;
  std::string text = key + "@[";
  for (size_t i = 0; i < offsets.size(); ++i)
    text += (i ? ", " : "") + std::to_string(offsets[i]);
  return text + "]";
}

std::string dimsText(const dcp::Dims &dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

std::string claimHolder() {
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return "pid " + std::to_string(::getpid()) + " on " + host + " since " + when;
}

std::string baseName(const std::string &path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string parentDir(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string trimSlashes(const std::string &path) {
  std::string out = path;
  while (out.size() > 1 && out.back() == '/')
    out.pop_back();
  return out;
}

static constexpr const char kStagingSuffix[] = ".fsdp-staging";

std::string stagingDirFor(const std::string &target) { return target + kStagingSuffix; }

std::string lockPathFor(const std::string &target) { return target + ".fsdp-lock"; }

Status refuseStagingDir(const std::string &dir) {
  std::string suffix = kStagingSuffix;
  if (dir.size() >= suffix.size() &&
      dir.compare(dir.size() - suffix.size(), suffix.size(), suffix) == 0)
    return makeError(dir + " is the staging directory of a save that never committed; "
                           "it is incomplete and is not read",
                     ErrorKind::NotFound);
  return Status::success();
}

Status writeFileDurably(Storage &storage, const std::string &dir, const std::string &name,
                        const std::string &bytes) {
  std::string temporary = dir + "/" + name + ".tmp";
  Result<std::unique_ptr<WritableFile>> file = storage.create(temporary);
  if (!file)
    return file.failure();
  if (Status status = (*file)->writeAt(0, {{bytes.data(), bytes.size()}}); !status)
    return status;
  if (Status status = (*file)->sync(); !status)
    return status;
  if (Status status = (*file)->close(); !status)
    return status;
  return storage.rename(temporary, dir + "/" + name);
}

} // namespace runtime
} // namespace fsdp
