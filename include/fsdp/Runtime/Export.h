//===- Export.h - A checkpoint's model as Hugging Face safetensors -*- C++ -*-===//
//
// `fsdp-ckpt export D --safetensors OUT`: the model's whole tensors, for
// inference outside training (transformers, vLLM, SGLang). From any
// checkpoint the reader reads (ours, PyTorch's, Megatron-FSDP's): the
// `model.` keys with the prefix dropped (a checkpoint without any exports
// every tensor not under `optimizer.`), each assembled from its saved
// chunks (every item checked on the way) and written before the next is
// read, so memory stays at about one tensor (two when cast). Shards of at
// most `maxShardBytes` of tensor data, `model-0000i-of-0000n.safetensors`
// with `model.safetensors.index.json`, or one `model.safetensors`. Tied
// parameters keep one entry per name, as the checkpoint has them. With
// `hfConfigDir` (--hf-config), the model's config.json, generation config and
// tokenizer files are copied in from a Hugging Face model directory (a hub
// snapshot too), so that transformers' from_pretrained(OUT) loads it: the
// checkpoint itself records no such directory. The output is written into a
// staging directory beside OUT and renamed into place.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_RUNTIME_EXPORT_H
#define FSDP_RUNTIME_EXPORT_H

#include "fsdp/Runtime/Checkpoint.h"

#include <optional>

namespace fsdp {
namespace runtime {

struct ExportOptions {
  /// Floating tensors cast to this dtype (round to nearest even, as
  /// PyTorch's `.to()`); others keep theirs. Unset: the checkpoint's.
  std::optional<dcp::DType> dtype;
  /// Tensor bytes per file at most (Hugging Face's max_shard_size); a
  /// tensor larger than that gets a file of its own.
  uint64_t maxShardBytes = 5'000'000'000;
  bool overwrite = false;
  bool verifyChecksums = true;
  /// A Hugging Face model directory whose config.json (required) and, where
  /// present, the other kHfConfigFiles are copied into the export: regular
  /// files only (a hub snapshot's links to its blobs followed, no other link
  /// out), each at most kMaxHfConfigFileBytes. They replace files of those
  /// names that an --overwrite would keep. Empty: none copied.
  std::string hfConfigDir;
  ProgressCallback progress;
};

/// What --hf-config copies: the config, the generation config and the
/// tokenizer files transformers reads beside the weights.
extern const char *const kHfConfigFiles[];
extern const size_t kHfConfigFileCount;
constexpr uint64_t kMaxHfConfigFileBytes = uint64_t(256) << 20;

struct ExportResult {
  uint64_t tensors = 0;
  uint64_t bytes = 0;              // tensor bytes written
  uint64_t largestTensorBytes = 0; // what the export held at most (per copy)
  uint64_t bytesReadStorage = 0;
  std::vector<std::string> files;
  std::vector<std::string> configFiles; // copied from hfConfigDir
  double seconds = 0;
};

Result<ExportResult> exportSafetensors(const std::string &dir, const std::string &out,
                                       Storage &storage, const ExportOptions &options = {});

/// "5GB" (10^9), "500MB", "2GiB" (2^30), "100KB", "1234" (bytes): sizes as
/// Hugging Face writes them. An error for anything else or zero.
Result<uint64_t> parseByteSize(const std::string &text);

} // namespace runtime
} // namespace fsdp

#endif // FSDP_RUNTIME_EXPORT_H
