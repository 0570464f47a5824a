//===- HfImport.h - Load a Hugging Face model into a plan's layout -*- C++ -*-===//
//
// Fine-tuning starts from a pretrained model in Hugging Face's format:
// `model.safetensors`, or the shards `model.safetensors.index.json` names.
// loadHuggingFace fills this rank's main weights from it: each tensor's
// name is an FQN (after the caller's renames), and since safetensors holds
// every tensor whole, row-major and contiguous, each piece of this rank's
// layout is one byte range (or a few) of its tensor, read alone: no rank
// reads a whole tensor it does not hold. Values are cast to the
// main-weight dtype (f64, f32, bf16 and f16 between each other), the
// optimizer state is zeroed, the step is 0 and the model weights are
// refreshed. Tied parameters are read once, from whichever of their FQNs
// the files hold.
//
// Every file is hostile (Safetensors.h checks each header); files are
// opened through Storage only, by plain names from the index. A symbolic
// link out of the directory is refused (InvalidArgument), except in a
// Hugging Face hub snapshot (`<repo>/snapshots/<rev>`, beside
// `<repo>/blobs/`, what huggingface_hub's cache holds): there a link
// straight to a regular file in `<repo>/blobs/` is followed. A tensor the
// plan needs and the files lack, or one whose shape or dtype does not fit,
// is an Incompatible error naming it, before any data is read.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_HFIMPORT_H
#define FSDP_RUNTIME_HFIMPORT_H

#include "fsdp/Format/Safetensors.h"
#include "fsdp/Runtime/Checkpoint.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {
namespace runtime {

/// The files a single-file model and a sharded one are found by.
constexpr const char *kHfSingleFile = "model.safetensors";
constexpr const char *kHfIndexFile = "model.safetensors.index.json";

/// A Hugging Face model directory, resolved: what decides which of its
/// files' links are followed.
struct HfDirectory {
  std::string dir;     // as given, trailing slashes trimmed
  std::string realDir; // every link resolved
  std::string blobs;   // a hub snapshot's <repo>/blobs (real), or empty

  /// `dir` checked (a directory, or a link to one: else NotFound or
  /// InvalidArgument) and resolved.
  static Result<HfDirectory> open(const std::string &dir, Storage &storage);
  /// The path the file `name` (a plain name) is opened at: dir/name, or for
  /// a hub snapshot's link the blob it leads to. Any other link out of the
  /// directory is an InvalidArgument error naming the link and where it
  /// leads; a link to nothing is NotFound.
  Result<std::string> sourcePath(const std::string &name, Storage &storage) const;
};

/// One tensor of a Hugging Face model directory: its file and its entry.
struct HfTensor {
  std::string file; // a plain name in the directory
  safetensors::TensorEntry entry;
};

/// A model directory, opened: every header read and checked, every file
/// kept open for reads.
class HfModel {
public:
  static Result<std::unique_ptr<HfModel>> open(const std::string &dir, Storage &storage);

  const std::string &dir() const { return dir_; }
  /// Every tensor, by name.
  const std::map<std::string, HfTensor> &tensors() const { return tensors_; }
  const HfTensor *find(const std::string &name) const;
  /// `count` bytes of `tensor` from byte `offset` of it (in bounds: the
  /// caller checks against entry.bytes).
  Status read(const HfTensor &tensor, uint64_t offset, uint64_t count, char *out) const;
  /// directory/name, for messages (escaped).
  std::string pathOf(const std::string &name) const;
  /// The bytes of every header and index read.
  uint64_t headerBytes() const { return headerBytes_; }

private:
  HfModel(HfDirectory where) : where_(std::move(where)), dir_(where_.dir) {}
  Status openFile(const std::string &name, Storage &storage);
  HfDirectory where_;
  std::string dir_;
  std::map<std::string, std::unique_ptr<zip::ByteSource>> files_;
  std::map<std::string, safetensors::FileHeader> headers_;
  std::map<std::string, HfTensor> tensors_;
  uint64_t headerBytes_ = 0;
};

/// How the files' tensor names become the plan's FQNs.
struct HfKeyMap {
  /// By name first: a file's tensor -> its FQN; "" leaves the tensor out.
  std::map<std::string, std::string> names;
  /// Then the first rule whose prefix starts the name: that prefix is
  /// replaced (("model.", "") drops a `model.` prefix).
  std::vector<std::pair<std::string, std::string>> prefixes;

  /// The FQN of a file's tensor ("" when left out).
  std::string fqnOf(const std::string &name) const;
};

struct HfLoadOptions {
  HfKeyMap keyMap;
  /// Worker threads reading pieces (0: defaultThreads()).
  unsigned threads = 0;
  /// Host staging per worker (0: its share of defaultStagingBytes).
  uint64_t stagingBytes = 0;
  bool syncModelWeights = true;
  ProgressCallback progress;
  /// Told on the committing rank what a user should know (tensors the plan
  /// does not use).
  std::function<void(const std::string &)> notice;
  /// Every key the plan saves, sorted (LoadOptions::plannedKeys): the
  /// committing rank checks that the files hold every model tensor of it,
  /// not only those of its own pieces.
  std::function<Result<const std::vector<std::string> *>()> plannedKeys;
  int64_t root = 0;
};

/// Loads the model in `dir` into this rank's buffers (collective: every
/// rank agrees on the outcome). LoadResult::step is 0; no bytes or tensor
/// items.
Result<LoadResult> loadHuggingFace(const plan::RankPlan &plan, RankBuffers &buffers,
                                   const std::string &dir, Communicator &comm, Storage &storage,
                                   const HfLoadOptions &options = {});

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_HFIMPORT_H
