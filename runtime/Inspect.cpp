//===- Inspect.cpp - Describe any DCP checkpoint directory ----------------===//
#include "fsdp/Runtime/Inspect.h"
#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Format/Pickle.h"
#include "fsdp/Format/Zip.h"
#include "fsdp/Runtime/FileSource.h"

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <sstream>

namespace fsdp {
namespace runtime {

namespace {

std::string dimsText(const dcp::Dims &dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

/// The Python repr of a bytes item's value (never executed: the restricted
/// unpickler only builds a tree).
Result<std::string> bytesItemValue(const std::string &dir, const dcp::StorageInfo &info,
                                   std::map<std::string, std::unique_ptr<FileSource>> &files) {
  auto &file = files[info.relativePath];
  if (!file) {
    Result<std::unique_ptr<FileSource>> opened = FileSource::open(dir + "/" + info.relativePath);
    if (!opened)
      return opened.failure();
    file = opened.take();
  }
  if (info.transformDescriptors && !info.transformDescriptors->empty())
    return makeError("stored with transforms (" + info.transformDescriptors->front() + ")");
  if (info.offset > file->size() || info.length > file->size() - info.offset)
    return makeError(file->path() + ": item at " + std::to_string(info.offset) + " (" +
                     std::to_string(info.length) + " bytes) lies past the end: truncated file");
  zip::SliceSource slice(*file, info.offset, info.length);
  Result<zip::TorchSaveItem> item = zip::openTorchSaveItem(slice);
  if (!item)
    return propagate(item, file->path() + ": " + item.error());
  Result<pickle::Document> document = pickle::read(item->dataPkl);
  if (!document)
    return propagate(document, file->path() + ": " + document.error());
  return pickle::toPythonRepr(*document->root());
}

} // namespace

Status inspectCheckpoint(const std::string &dir, const InspectOptions &options,
                         std::ostream &out) {
  std::string metadataPath = dir + "/.metadata";
  Result<std::string> bytes = readWholeFile(metadataPath);
  if (!bytes)
    return propagate(bytes, bytes.error() + " (is this a DCP checkpoint directory?)");
  Result<dcp::Metadata> metadata = dcp::parseMetadata(*bytes);
  if (!metadata)
    return propagate(metadata, metadataPath + ": " + metadata.error());

  // Chunk -> storage, and per-file totals.
  std::map<std::pair<std::string, dcp::Dims>, const dcp::StorageInfo *> storageOf;
  std::map<std::string, std::pair<uint64_t, uint64_t>> fileUse; // items, bytes
  for (const auto &[index, info] : metadata->storageData) {
    storageOf[{index.fqn, index.offset.value_or(dcp::Dims())}] = &info;
    auto &use = fileUse[info.relativePath];
    use.first += 1;
    use.second += info.length;
  }
  std::map<std::string, std::unique_ptr<FileSource>> files;
  // A value that cannot be read is shown, and fails the command at the end.
  std::string unreadable;
  auto valueText = [&](const std::string &key, const dcp::StorageInfo &info) {
    Result<std::string> value = bytesItemValue(dir, info, files);
    if (value)
      return *value;
    if (unreadable.empty())
      unreadable = key + ": " + value.error();
    return "<unreadable: " + value.error() + ">";
  };
  size_t tensors = 0;
  for (const auto &entry : metadata->stateDictMetadata)
    tensors += !entry.second.isBytes;

  if (options.json) {
    nlohmann::ordered_json json;
    json["directory"] = dir;
    json["version"] = metadata->version ? nlohmann::ordered_json(*metadata->version)
                                        : nlohmann::ordered_json(nullptr);
    nlohmann::ordered_json keys = nlohmann::ordered_json::array();
    for (const auto &[key, storage] : metadata->stateDictMetadata) {
      nlohmann::ordered_json item{{"key", key}};
      if (storage.isBytes) {
        item["kind"] = "bytes";
        auto found = storageOf.find({key, dcp::Dims()});
        if (found != storageOf.end()) {
          item["file"] = found->second->relativePath;
          item["offset"] = found->second->offset;
          item["length"] = found->second->length;
          if (options.values)
            item["value"] = valueText(key, *found->second);
        }
      } else {
        item["kind"] = "tensor";
        item["dtype"] = dcp::dtypeInfo(storage.properties.dtype).name;
        item["shape"] = storage.size;
        nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
        for (const dcp::ChunkMetadata &chunk : storage.chunks) {
          nlohmann::ordered_json c{{"offsets", chunk.offsets}, {"sizes", chunk.sizes}};
          auto found = storageOf.find({key, chunk.offsets});
          if (found != storageOf.end()) {
            c["file"] = found->second->relativePath;
            c["offset"] = found->second->offset;
            c["length"] = found->second->length;
          }
          chunks.push_back(c);
        }
        item["chunks"] = chunks;
      }
      keys.push_back(item);
    }
    json["keys"] = keys;
    nlohmann::ordered_json fileList = nlohmann::ordered_json::array();
    for (const auto &[name, use] : fileUse)
      fileList.push_back({{"name", name}, {"items", use.first}, {"bytes", use.second}});
    json["files"] = fileList;
    out << json.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return unreadable.empty() ? Status::success() : Status(makeError(unreadable));
  }

  out << "checkpoint " << dir << ": " << metadata->stateDictMetadata.size() << " keys ("
      << tensors << " tensors, " << metadata->stateDictMetadata.size() - tensors
      << " bytes items), " << fileUse.size() << " files, format version "
      << metadata->version.value_or("unset") << "\n";
  for (const auto &[key, storage] : metadata->stateDictMetadata) {
    if (storage.isBytes) {
      out << "  " << key << "  bytes";
      auto found = storageOf.find({key, dcp::Dims()});
      if (found != storageOf.end()) {
        out << "  " << found->second->relativePath << " @" << found->second->offset << " +"
            << found->second->length;
        if (options.values)
          out << "  = " << valueText(key, *found->second);
      }
      out << "\n";
      continue;
    }
    out << "  " << key << "  " << dcp::dtypeInfo(storage.properties.dtype).name << " "
        << dimsText(storage.size) << "  " << storage.chunks.size() << " chunk"
        << (storage.chunks.size() == 1 ? "" : "s") << "\n";
    for (const dcp::ChunkMetadata &chunk : storage.chunks) {
      out << "    offsets " << dimsText(chunk.offsets) << " sizes " << dimsText(chunk.sizes);
      auto found = storageOf.find({key, chunk.offsets});
      if (found != storageOf.end())
        out << "  " << found->second->relativePath << " @" << found->second->offset << " +"
            << found->second->length;
      else
        out << "  (no storage entry)";
      out << "\n";
    }
  }
  out << "files:\n";
  for (const auto &[name, use] : fileUse)
    out << "  " << name << "  " << use.first << " items, " << use.second << " bytes\n";
  return unreadable.empty() ? Status::success() : Status(makeError(unreadable));
}

} // namespace runtime
} // namespace fsdp
