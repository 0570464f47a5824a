//===- RuntimeSupport.cpp - Helpers shared by save, load and verify -------===//
#include "RuntimeSupport.h"

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
  if (dir.size() >= suffix.size() && dir.compare(dir.size() - suffix.size(), suffix.size(), suffix) == 0)
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

// "O" + payload, or "E" + the kind's digit + the message.
std::string encodeOutcome(const Status &status, const std::string &payload) {
  if (status)
    return "O" + payload;
  return "E" + std::string(1, static_cast<char>('0' + static_cast<int>(status.kind()))) +
         status.error();
}

Outcome decodeOutcome(const std::string &bytes) {
  if (!bytes.empty() && bytes[0] == 'O')
    return {Status::success(), bytes.substr(1)};
  if (bytes.size() < 2 || bytes[0] != 'E' || bytes[1] < '0' ||
      bytes[1] > '0' + static_cast<int>(ErrorKind::Busy))
    return {makeError("a rank sent no readable answer"), ""};
  return {makeError(bytes.substr(2), static_cast<ErrorKind>(bytes[1] - '0')), ""};
}

Status agree(Communicator &comm, const Status &local, int64_t root) {
  Result<std::vector<std::string>> gathered = comm.gather(encodeOutcome(local), root);
  if (!gathered)
    return gathered.failure();
  std::string verdict = encodeOutcome(Status::success());
  if (comm.rank() == root)
    for (size_t r = 0; r < gathered->size(); ++r) {
      Outcome outcome = decodeOutcome((*gathered)[r]);
      if (!outcome.status) {
        verdict = encodeOutcome(
            comm.size() > 1
                ? propagate(outcome.status, "rank " + std::to_string(r) + ": " +
                                                outcome.status.error())
                : outcome.status);
        break;
      }
    }
  Result<std::string> decided = comm.broadcast(verdict, root);
  if (!decided)
    return decided.failure();
  return decodeOutcome(*decided).status;
}

} // namespace runtime
} // namespace fsdp
