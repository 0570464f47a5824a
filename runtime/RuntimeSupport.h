//===- RuntimeSupport.h - Helpers shared by save, load and verify -*- C++ -*-===//
#ifndef FSDP_RUNTIME_RUNTIMESUPPORT_H
#define FSDP_RUNTIME_RUNTIMESUPPORT_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Format/Zip.h"
#include "fsdp/Runtime/Communicator.h"
#include "fsdp/Runtime/Storage.h"

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace fsdp {
namespace runtime {

/// Planned tensor-item zips by (dtype, chunk sizes, where the data starts in
/// its page): the same bytes the planner sized, so offsets agree.
class ItemLayoutCache {
public:
  Result<const zip::ItemLayout *> get(dcp::DType dtype, const dcp::Dims &sizes,
                                      uint64_t dataPageOffset);

private:
  std::map<std::tuple<dcp::DType, dcp::Dims, uint64_t>, std::unique_ptr<zip::ItemLayout>>
      layouts_;
};

/// The integrity index's name for an item: the key, plus the chunk offsets
/// for tensors ("model.w@[4, 0]").
std::string itemChecksumKey(const std::string &key, const dcp::Dims &offsets, bool isTensor);

/// "[4, 0]": a chunk's offsets or sizes, a shape, for messages.
std::string dimsText(const dcp::Dims &dims);

std::string baseName(const std::string &path);
std::string parentDir(const std::string &path);
std::string trimSlashes(const std::string &path);
/// Where a save into `target` stages its files: beside it, so the commit is
/// a rename within one directory.
std::string stagingDirFor(const std::string &target);
/// The lock file a save of `target` claims, beside it.
std::string lockPathFor(const std::string &target);
/// Who holds a claim ("pid P on HOST since T"), for the busy error of a
/// second save or export.
std::string claimHolder();
/// An error when `dir` is a staging directory: a save that never committed,
/// however complete its files look.
Status refuseStagingDir(const std::string &dir);

/// What --overwrite may replace: a checkpoint (ours or DCP's: a `.metadata`
/// in it) for a save, a safetensors export of ours for an export; an empty
/// directory for either. Anything else stays untouched. The other plain files
/// of an export directory (config.json, tokenizer files: what makes it a
/// Hugging Face model) are carried into the new export.
enum class ReplaceTarget { Checkpoint, Export };
/// The file that marks a directory as an export of ours (a Hugging Face model
/// directory has the same safetensors names).
inline constexpr const char *kExportMarker = ".fsdp-export";
struct ExistingTarget {
  bool exists = false;
  uint32_t mode = 0;                // kept by the replacement
  std::vector<std::string> carried; // names linked into the replacement
};
/// What stands at `target`, or an invalid-argument error naming it when it
/// is something an overwrite must not replace (or `overwrite` is false).
Result<ExistingTarget> checkReplaceable(Storage &storage, const std::string &target,
                                        ReplaceTarget what, bool overwrite);
/// Puts the staged directory at `target`, then syncs the parent. What stands
/// at `target` is checked again first (anything may have appeared since the
/// save began): only what checkReplaceable accepts is replaced, its mode kept
/// and its carried files linked into the new directory. What was replaced
/// ends at the staging path: removed there, or, when `keptReplaced` is not
/// null, left for the caller to remove (*keptReplaced then says whether
/// anything was replaced).
Status commitStaged(Storage &storage, const std::string &staging, const std::string &target,
                    ReplaceTarget what, bool overwrite, bool *keptReplaced = nullptr);

/// Which directory a path names when a read starts (the path resolved), so
/// that a failure can tell a checkpoint replaced meanwhile from a corrupt one.
struct DirIdentity {
  bool known = false;
  uint64_t device = 0, inode = 0;
};
DirIdentity identityOf(Storage &storage, const std::string &dir);
/// `failure` as it is, unless `dir` no longer names the directory the read
/// started in: then a busy error saying it was replaced while being read.
Status explainIfReplaced(Storage &storage, const std::string &dir, const DirIdentity &before,
                         Status failure);

/// dir/name.tmp, fsync, rename to dir/name.
Status writeFileDurably(Storage &storage, const std::string &dir, const std::string &name,
                        const std::string &bytes);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_RUNTIMESUPPORT_H
