//===- Export.cpp - A checkpoint's model as Hugging Face safetensors ------===//
#include "fsdp/Runtime/Export.h"
#include "Loader.h"
#include "Parallel.h"
#include "RuntimeSupport.h"
#include "fsdp/Format/Safetensors.h"
#include "fsdp/Runtime/Cast.h"
#include "fsdp/Runtime/HfImport.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <new>
#include <set>

namespace fsdp {
namespace runtime {

const char *const kHfConfigFiles[] = {
    "config.json",         "generation_config.json",  "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json",          "merges.txt",              "added_tokens.json",
    "vocab.txt",           "spiece.model",            "chat_template.jinja",
    "chat_template.json",  "preprocessor_config.json"};
const size_t kHfConfigFileCount = sizeof(kHfConfigFiles) / sizeof(kHfConfigFiles[0]);

namespace {

constexpr const char kModelPrefix[] = "model.";

/// A config or tokenizer file to copy: its name and its bytes.
using ConfigFile = std::pair<std::string, std::string>;

/// The files of kHfConfigFiles that `dir` holds, read whole before the
/// export writes anything: config.json must be there; each is a regular
/// file (or a link Hugging Face's directories may hold) of bounded size.
Result<std::vector<ConfigFile>> readConfigFiles(const std::string &dir, Storage &storage) {
  Result<HfDirectory> where = HfDirectory::open(dir, storage);
  if (!where)
    return propagate(where, "--hf-config " + where.error());
  std::vector<ConfigFile> files;
  for (size_t i = 0; i < kHfConfigFileCount; ++i) {
    std::string name = kHfConfigFiles[i], path = where->dir + "/" + name;
    Result<PathStatus> found = storage.status(path);
    if (!found)
      return found.failure();
    if (found->kind == PathStatus::Kind::Missing) {
      if (name == "config.json")
        return makeError(printable(path) +
                             ": missing: --hf-config names a Hugging Face model directory, which "
                             "holds config.json",
                         ErrorKind::NotFound);
      continue;
    }
    if (found->kind != PathStatus::Kind::RegularFile && found->kind != PathStatus::Kind::Link)
      return makeError(printable(path) + ": " +
                           (found->kind == PathStatus::Kind::Directory ? "a directory"
                                                                       : "not a regular file") +
                           ": --hf-config copies regular files only",
                       ErrorKind::InvalidArgument);
    Result<std::string> source = where->sourcePath(name, storage);
    if (!source)
      return source.failure();
    Result<std::unique_ptr<zip::ByteSource>> file = storage.openRead(*source);
    if (!file)
      return file.failure();
    uint64_t size = (*file)->size();
    if (size > kMaxHfConfigFileBytes)
      return makeError(printable(path) + ": " + std::to_string(size) + " bytes, more than the " +
                           std::to_string(kMaxHfConfigFileBytes) +
                           " a config or tokenizer file may be",
                       ErrorKind::InvalidArgument);
    std::string bytes(size, '\0');
    if (Status status = (*file)->read(0, bytes.data(), bytes.size()); !status)
      return status.failure();
    files.emplace_back(name, std::move(bytes));
  }
  return files;
}

bool isFloating(dcp::DType dtype) {
  return dtype == dcp::DType::Float64 || dtype == dcp::DType::Float32 ||
         dtype == dcp::DType::BFloat16 || dtype == dcp::DType::Float16;
}

uint64_t elementCount(const dcp::Dims &shape) {
  uint64_t count = 1;
  for (int64_t size : shape)
    count *= static_cast<uint64_t>(size);
  return count;
}

/// A tensor's bytes in `dtype`, or nothing when a dimension is negative or
/// the product overflows (a hostile `.metadata`).
std::optional<uint64_t> tensorBytes(const dcp::Dims &shape, dcp::DType dtype) {
  uint64_t bytes = dcp::dtypeInfo(dtype).elementSize;
  for (int64_t size : shape)
    if (size < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(size), &bytes))
      return std::nullopt;
  return bytes;
}

/// The bytes of every data file `.metadata` names: no tensor assembled from
/// them can be larger, so nothing larger is allocated.
uint64_t dataFileBytes(CheckpointReader &reader, Storage &storage) {
  std::set<std::string> names;
  for (const auto &[index, info] : reader.metadata().storageData)
    if (info.relativePath.find('/') == std::string::npos && info.relativePath != ".." &&
        info.relativePath != ".")
      names.insert(info.relativePath);
  uint64_t total = 0;
  for (const std::string &name : names)
    if (Result<std::unique_ptr<zip::ByteSource>> file = storage.openRead(reader.pathOf(name)))
      total += (*file)->size();
  return total;
}

/// A tensor of the checkpoint, as it goes out.
struct Exported {
  std::string key;  // in the checkpoint
  KeyInfo saved;    // its dtype and shape there
  safetensors::TensorSpec spec; // its name, dtype and shape in the export
  uint64_t bytes = 0;
};

std::string shardName(size_t index, size_t count) {
  if (count == 1)
    return "model.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

/// The tensors to export, in the checkpoint's key order.
Result<std::vector<Exported>> selectTensors(CheckpointReader &reader, Storage &storage,
                                            const ExportOptions &options) {
  std::vector<std::string> keys;
  bool anyModel = false;
  for (const auto &[key, storage] : reader.metadata().stateDictMetadata)
    if (!storage.isBytes)
      anyModel = anyModel || key.rfind(kModelPrefix, 0) == 0;
  for (const auto &[key, storage] : reader.metadata().stateDictMetadata) {
    if (storage.isBytes)
      continue;
    if (anyModel ? key.rfind(kModelPrefix, 0) != 0 : key.rfind("optimizer.", 0) == 0)
      continue;
    keys.push_back(key);
  }
  if (keys.empty())
    return makeError(printable(reader.dir()) + " holds no model tensors to export",
                     ErrorKind::Incompatible);
  std::vector<Exported> tensors;
  uint64_t available = dataFileBytes(reader, storage);
  for (const std::string &key : keys) {
    std::optional<KeyInfo> saved = reader.keyInfo(key);
    if (!saved)
      return makeError(key + ": missing in " + reader.pathOf(".metadata"), ErrorKind::Corrupt);
    std::optional<uint64_t> savedBytes = tensorBytes(saved->shape, saved->dtype);
    if (!savedBytes || *savedBytes > available)
      return makeError(printable(key) + ": " + reader.pathOf(".metadata") + " gives it shape " +
                           dimsText(saved->shape) + ", more than the " +
                           std::to_string(available) + " bytes of the checkpoint's data files",
                       ErrorKind::Corrupt);
    Exported tensor{key, *saved, {}, 0};
    tensor.spec.name = anyModel ? key.substr(sizeof(kModelPrefix) - 1) : key;
    tensor.spec.dtype = options.dtype && isFloating(saved->dtype) ? *options.dtype : saved->dtype;
    tensor.spec.shape = saved->shape;
    tensor.bytes = elementCount(saved->shape) * dcp::dtypeInfo(tensor.spec.dtype).elementSize;
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

/// Consecutive runs of tensors of at most `maxBytes` each (a larger tensor
/// alone).
std::vector<std::vector<size_t>> cutShards(const std::vector<Exported> &tensors, uint64_t maxBytes) {
  std::vector<std::vector<size_t>> shards;
  uint64_t filled = 0;
  for (size_t index = 0; index < tensors.size(); ++index) {
    if (shards.empty() || (filled + tensors[index].bytes > maxBytes && filled > 0)) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(index);
    filled += tensors[index].bytes;
  }
  return shards;
}

/// Reads a whole tensor into `out` (its saved dtype), through the loader:
/// every saved chunk checked, overlaps compared, coverage checked.
Status readWholeTensor(CheckpointReader &reader, const Exported &tensor, char *out) {
  uint64_t elements = elementCount(tensor.saved.shape);
  plan::RankPlan plan;
  plan.buffers.push_back({0, plan::BufferRole::MainWeight, tensor.saved.dtype,
                          static_cast<int64_t>(elements), 0, false});
  plan::ReadItem read;
  read.key = tensor.key;
  read.dtype = tensor.saved.dtype;
  read.globalShape = tensor.saved.shape;
  read.chunkOffsets.assign(tensor.saved.shape.size(), 0);
  read.chunkSizes = tensor.saved.shape;
  read.buffer = {0, plan::BufferRole::MainWeight, 0, static_cast<int64_t>(elements)};
  plan.reads.push_back(read);
  Result<RankBuffers> buffers = RankBuffers::wrap(plan, {{{0, plan::BufferRole::MainWeight}, out}});
  if (!buffers)
    return buffers.failure();
  Loader loader(reader);
  if (Status status = loader.plan(plan.reads); !status)
    return status;
  BandStaging staging; // unused: host memory
  return loader.loadPiece(plan.reads[0], 0, *buffers, staging);
}

/// An export may not replace the checkpoint it reads, nor anything holding it
/// or inside it: refused before anything is written.
Status refuseOverlap(Storage &storage, const std::string &source, const std::string &target) {
  Result<std::string> from = storage.realPath(source);
  if (!from)
    return from.failure();
  // The target may not exist yet: its parent does, or the export fails later.
  std::string to = target;
  if (Result<std::string> whole = storage.realPath(target))
    to = *whole;
  else if (Result<std::string> parent = storage.realPath(parentDir(target)))
    to = *parent + "/" + baseName(target);
  auto within = [](const std::string &inner, const std::string &outer) {
    return inner == outer ||
           (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
            (outer == "/" || inner[outer.size()] == '/'));
  };
  if (within(to, *from) || within(*from, to))
    return makeError(printable(target) + ": the export would " +
                         (within(to, *from) ? "be written inside" : "replace a directory holding") +
                         " the checkpoint it reads (" + printable(source) +
                         "): choose a directory apart from it",
                     ErrorKind::InvalidArgument);
  return Status::success();
}

/// Writes the shards and the index into `staging`.
Status writeExport(CheckpointReader &reader, const std::vector<Exported> &tensors,
                   const std::vector<std::vector<size_t>> &shards,
                   const std::vector<ConfigFile> &configFiles, const std::string &staging,
                   Storage &storage, const ExportOptions &options, ExportResult &result) {
  uint64_t total = 0;
  for (const Exported &tensor : tensors)
    total += tensor.bytes;
  ProgressReporter progress(options.progress, total);
  nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
  std::string saved, cast; // one tensor as saved, and cast
  for (size_t shard = 0; shard < shards.size(); ++shard) {
    std::vector<safetensors::TensorSpec> specs;
    for (size_t index : shards[shard])
      specs.push_back(tensors[index].spec);
    Result<safetensors::FileLayout> layout = safetensors::layoutFile(specs, {{"format", "pt"}});
    if (!layout)
      return layout.failure();
    std::string name = shardName(shard, shards.size());
    Result<std::unique_ptr<WritableFile>> file = storage.create(staging + "/" + name);
    if (!file)
      return file.failure();
    if (Status status = (*file)->writeAt(0, {{layout->header.data(), layout->header.size()}});
        !status)
      return status;
    for (size_t position = 0; position < shards[shard].size(); ++position) {
      const Exported &tensor = tensors[shards[shard][position]];
      uint64_t savedBytes =
          elementCount(tensor.saved.shape) * dcp::dtypeInfo(tensor.saved.dtype).elementSize;
      // Sized for this tensor alone: memory follows the largest tensor.
      saved.assign(savedBytes, '\0');
      if (Status status = readWholeTensor(reader, tensor, saved.data()); !status)
        return status;
      const char *bytes = saved.data();
      if (tensor.spec.dtype != tensor.saved.dtype) {
        cast.assign(tensor.bytes, '\0');
        if (Status status = castElements(tensor.saved.dtype, saved.data(), tensor.spec.dtype,
                                         cast.data(), elementCount(tensor.saved.shape));
            !status)
          return propagate(status, tensor.key + ": " + status.error());
        bytes = cast.data();
      }
      if (Status status = (*file)->writeAt(layout->fileOffsets[position], {{bytes, tensor.bytes}});
          !status)
        return status;
      result.largestTensorBytes = std::max(result.largestTensorBytes, std::max(savedBytes, tensor.bytes));
      result.bytes += tensor.bytes;
      ++result.tensors;
      weightMap[tensor.spec.name] = name;
      if (Status status = progress.reached(result.bytes); !status)
        return status;
      std::string().swap(saved);
      std::string().swap(cast);
    }
    if (Status status = (*file)->sync(); !status)
      return status;
    if (Status status = (*file)->close(); !status)
      return status;
    result.files.push_back(name);
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                    {"weight_map", weightMap}};
    std::string text = index.dump(2) + "\n";
    if (Status status = writeFileDurably(storage, staging, "model.safetensors.index.json", text);
        !status)
      return status;
    result.files.push_back("model.safetensors.index.json");
  }
  for (const auto &[name, bytes] : configFiles) {
    if (Status status = writeFileDurably(storage, staging, name, bytes); !status)
      return status;
    result.configFiles.push_back(name);
  }
  // What lets a later --overwrite know this directory as an export of ours.
  if (Status status = writeFileDurably(storage, staging, kExportMarker,
                                       "written by fsdp-ckpt export; --overwrite replaces it\n");
      !status)
    return status;
  return storage.syncDir(staging);
}

} // namespace

Result<uint64_t> parseByteSize(const std::string &text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])))
    ++digits;
  std::string unit = text.substr(digits);
  for (char &c : unit)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::pair<const char *, uint64_t> kUnits[] = {
      {"", 1},           {"B", 1},
      {"KB", 1000},      {"MB", 1000'000},         {"GB", 1000'000'000},
      {"KIB", 1u << 10}, {"MIB", uint64_t(1) << 20}, {"GIB", uint64_t(1) << 30}};
  if (digits == 0 || digits > 15)
    return makeError("'" + text + "' is not a size (e.g. 5GB, 500MB, 2GiB)",
                     ErrorKind::InvalidArgument);
  uint64_t number = std::stoull(text.substr(0, digits));
  for (const auto &[name, scale] : kUnits)
    if (unit == name) {
      if (number == 0 || number > UINT64_MAX / scale)
        return makeError("'" + text + "' is not a usable size", ErrorKind::InvalidArgument);
      return number * scale;
    }
  return makeError("'" + text + "' is not a size (e.g. 5GB, 500MB, 2GiB)",
                   ErrorKind::InvalidArgument);
}

Result<ExportResult> exportSafetensors(const std::string &dir, const std::string &out,
                                       Storage &storage, const ExportOptions &options) {
  auto start = std::chrono::steady_clock::now();
  if (options.maxShardBytes == 0)
    return makeError("the largest shard size must be above zero", ErrorKind::InvalidArgument);
  if (options.dtype && !isFloating(*options.dtype))
    return makeError(std::string("an export casts to a floating dtype, not ") +
                         dcp::dtypeInfo(*options.dtype).name,
                     ErrorKind::InvalidArgument);
  ReaderOptions readerOptions;
  readerOptions.verifyItems = options.verifyChecksums;
  Result<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::open(dir, storage, readerOptions);
  if (!reader)
    return reader.failure();
  Result<std::vector<Exported>> tensors = selectTensors(**reader, storage, options);
  if (!tensors)
    return tensors.failure();
  std::vector<std::vector<size_t>> shards = cutShards(*tensors, options.maxShardBytes);
  std::vector<ConfigFile> configFiles;
  if (!options.hfConfigDir.empty()) {
    Result<std::vector<ConfigFile>> read = readConfigFiles(options.hfConfigDir, storage);
    if (!read)
      return read.failure();
    configFiles = read.take();
  }

  // Claimed like a save's target; staged beside it, renamed into place.
  std::string target = trimSlashes(out);
  if (target.empty())
    return makeError("the export directory is an empty path", ErrorKind::InvalidArgument);
  if (Status status = refuseOverlap(storage, trimSlashes(dir), target); !status)
    return status.failure();
  std::string staging = stagingDirFor(target);
  Result<std::unique_ptr<Claim>> claim = storage.claim(lockPathFor(target), claimHolder());
  if (!claim)
    return claim.failure();
  Result<ExistingTarget> existing =
      checkReplaceable(storage, target, ReplaceTarget::Export, options.overwrite);
  if (!existing)
    return existing.failure();
  bool targetExists = existing->exists;
  if (Status status = storage.removeTree(staging); !status)
    return status.failure();
  if (Status status = storage.makeDir(staging); !status)
    return status.failure();
  ExportResult result;
  Status wrote;
  try {
    wrote = writeExport(**reader, *tensors, shards, configFiles, staging, storage, options,
                        result);
  } catch (const std::bad_alloc &) {
    wrote = makeError("out of memory while exporting " + printable(trimSlashes(dir)),
                      ErrorKind::IO, ENOMEM);
  }
  if (!wrote) {
    (void)storage.removeTree(staging);
    return propagate(wrote, "export of " + printable(trimSlashes(dir)) + " failed, " +
                                (targetExists ? "nothing replaced" : "nothing written") + ": " +
                                wrote.error());
  }
  if (Status status =
          commitStaged(storage, staging, target, ReplaceTarget::Export, options.overwrite);
      !status)
    return status.failure();
  result.bytesReadStorage = (*reader)->bytesRead();
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

} // namespace runtime
} // namespace fsdp
