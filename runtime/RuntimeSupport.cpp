//===- RuntimeSupport.cpp - Helpers shared by save, load and verify -------===//
#include "RuntimeSupport.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>
#include <cstdio>

#include <ctime>
#include <unistd.h>

namespace fsdp {
namespace runtime {

Result<const zip::ItemLayout *> ItemLayoutCache::get(dcp::DType dtype, const dcp::Dims &sizes,
                                                     uint64_t dataPageOffset) {
  auto &slot = layouts_[{dtype, sizes, dataPageOffset}];
  if (!slot) {
    Result<zip::ItemLayout> layout = zip::planContiguousTensorItem(dtype, sizes, dataPageOffset);
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

namespace {

bool isExportFileName(const std::string &name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json")
    return true;
  unsigned index = 0, count = 0;
  char tail[2] = {0, 0};
  // model-00001-of-00002.safetensors, as the export names its shards.
  return name.size() == std::string("model-00001-of-00002.safetensors").size() &&
         std::sscanf(name.c_str(), "model-%5u-of-%5u.safetensor%1c", &index, &count, tail) == 3 &&
         tail[0] == 's' && index >= 1 && index <= count;
}

} // namespace

Result<ExistingTarget> checkReplaceable(Storage &storage, const std::string &target,
                                        ReplaceTarget what, bool overwrite) {
  if (target.empty())
    return makeError("the target directory is an empty path", ErrorKind::InvalidArgument);
  Result<PathStatus> found = storage.status(target);
  if (!found)
    return found.failure();
  ExistingTarget existing;
  if (found->kind == PathStatus::Kind::Missing)
    return existing;
  existing.exists = true;
  existing.mode = found->mode;
  const char *noun = what == ReplaceTarget::Checkpoint ? "a checkpoint" : "an export";
  if (!overwrite)
    return makeError(printable(target) + ": " +
                         (what == ReplaceTarget::Checkpoint ? "a checkpoint already exists"
                                                            : "already exists") +
                         " (pass --overwrite to replace it)",
                     ErrorKind::InvalidArgument);
  auto refuse = [&](const std::string &why) {
    return makeError(printable(target) + ": " + why + ": --overwrite replaces only " + noun +
                         (what == ReplaceTarget::Checkpoint
                              ? " (a directory with a .metadata)"
                              : " of safetensors files this tool wrote") +
                         "; remove it yourself if it is meant to go",
                     ErrorKind::InvalidArgument);
  };
  switch (found->kind) {
  case PathStatus::Kind::Directory:
    break;
  case PathStatus::Kind::RegularFile:
    return refuse("a regular file, not " + std::string(noun));
  case PathStatus::Kind::Link:
    return refuse("a symbolic link, not " + std::string(noun));
  default:
    return refuse("not a directory");
  }
  Result<std::vector<std::string>> names = storage.listDir(target);
  if (!names)
    return names.failure();
  if (what == ReplaceTarget::Checkpoint) {
    Result<PathStatus> metadata = storage.status(target + "/.metadata");
    if (!metadata)
      return metadata.failure();
    if (!names->empty() && metadata->kind != PathStatus::Kind::RegularFile)
      return refuse("a directory without a .metadata, not " + std::string(noun));
    return existing;
  }
  if (!names->empty() && !std::count(names->begin(), names->end(), kExportMarker))
    return refuse(std::string("no ") + kExportMarker + " in it, so not an export of ours");
  for (const std::string &name : *names) {
    if (isExportFileName(name) || name == kExportMarker)
      continue;
    Result<PathStatus> entry = storage.status(target + "/" + name);
    if (!entry)
      return entry.failure();
    bool model = name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0;
    if (entry->kind != PathStatus::Kind::RegularFile || model)
      return refuse("it holds '" + printable(name) + "', " +
                    (model ? "safetensors that no export of ours wrote"
                           : "which is not a plain file"));
    existing.carried.push_back(name);
  }
  return existing;
}

Status commitStaged(Storage &storage, const std::string &staging, const std::string &target,
                    ReplaceTarget what, bool overwrite, bool *keptReplaced) {
  if (keptReplaced)
    *keptReplaced = false;
  Result<ExistingTarget> found = checkReplaceable(storage, target, what, overwrite);
  if (!found)
    return found.failure();
  const ExistingTarget &existing = *found;
  if (existing.exists) {
    for (const std::string &name : existing.carried)
      if (!storage.exists(staging + "/" + name)) // what the new one brings wins (--hf-config)
        if (Status status = storage.link(target + "/" + name, staging + "/" + name); !status)
          return status;
    if (Status status = storage.setMode(staging, existing.mode); !status)
      return status;
    if (Status status = storage.exchange(staging, target); !status)
      return status;
    // What was replaced now sits at the staging path.
    if (keptReplaced)
      *keptReplaced = true;
    else if (Status status = storage.removeTree(staging); !status)
      return status;
  } else if (Status status = storage.rename(staging, target); !status) {
    return status;
  }
  return storage.syncDir(parentDir(target));
}

DirIdentity identityOf(Storage &storage, const std::string &dir) {
  DirIdentity identity;
  Result<std::string> real = storage.realPath(dir);
  if (!real)
    return identity;
  Result<PathStatus> found = storage.status(*real);
  if (found && found->kind == PathStatus::Kind::Directory) {
    identity.known = true;
    identity.device = found->device;
    identity.inode = found->inode;
  }
  return identity;
}

Status explainIfReplaced(Storage &storage, const std::string &dir, const DirIdentity &before,
                         Status failure) {
  if (failure || !before.known)
    return failure;
  DirIdentity now = identityOf(storage, dir);
  if (now.known && now.device == before.device && now.inode == before.inode)
    return failure;
  return makeError(printable(trimSlashes(dir)) +
                       ": the checkpoint was replaced while it was being read (a save with "
                       "--overwrite committed meanwhile); read it again",
                   ErrorKind::Busy);
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
