//===- Inspect.cpp - Describe any DCP checkpoint directory ----------------===//
#include "fsdp/Runtime/Inspect.h"
#include "RuntimeSupport.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Support/Printable.h"

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <new>

namespace fsdp {
namespace runtime {

namespace {

Status describe(CheckpointReader &reader, const InspectOptions &options, std::ostream &out) {
  const dcp::Metadata &metadata = reader.metadata();
  std::map<std::string, std::pair<uint64_t, uint64_t>> fileUse; // items, bytes
  for (const auto &[index, info] : metadata.storageData) {
    auto &use = fileUse[info.relativePath];
    use.first += 1;
    use.second += info.length;
  }
  // A value that cannot be read is shown, and fails the command at the end.
  Status unreadable = Status::success();
  auto valueText = [&](const std::string &key) {
    Result<std::string> value = reader.bytesItemRepr(key);
    if (value)
      return value.take();
    if (unreadable)
      unreadable = value.failure();
    return "<unreadable: " + value.error() + ">";
  };
  size_t tensors = 0;
  for (const auto &entry : metadata.stateDictMetadata)
    tensors += !entry.second.isBytes;

  if (options.json) {
    // JSON escapes control characters itself; invalid UTF-8 is replaced.
    nlohmann::ordered_json json;
    json["directory"] = reader.dir();
    json["version"] = metadata.version ? nlohmann::ordered_json(*metadata.version)
                                       : nlohmann::ordered_json(nullptr);
    nlohmann::ordered_json keys = nlohmann::ordered_json::array();
    for (const auto &[key, storage] : metadata.stateDictMetadata) {
      nlohmann::ordered_json item{{"key", key}};
      if (storage.isBytes) {
        item["kind"] = "bytes";
        if (const dcp::StorageInfo *found = reader.storageOf(key, std::nullopt)) {
          item["file"] = found->relativePath;
          item["offset"] = found->offset;
          item["length"] = found->length;
          if (options.values)
            item["value"] = valueText(key);
        }
      } else {
        item["kind"] = "tensor";
        item["dtype"] = dcp::dtypeInfo(storage.properties.dtype).name;
        item["shape"] = storage.size;
        nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
        for (const dcp::ChunkMetadata &chunk : storage.chunks) {
          nlohmann::ordered_json c{{"offsets", chunk.offsets}, {"sizes", chunk.sizes}};
          if (const dcp::StorageInfo *found = reader.storageOf(key, chunk.offsets)) {
            c["file"] = found->relativePath;
            c["offset"] = found->offset;
            c["length"] = found->length;
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
    // ensure_ascii: DEL and every non-ASCII character escaped as \uXXXX too.
    out << json.dump(1, ' ', true, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return unreadable;
  }

  // Text: every byte that came from a file is escaped.
  out << "checkpoint " << printable(reader.dir()) << ": " << metadata.stateDictMetadata.size()
      << " keys (" << tensors << " tensors, " << metadata.stateDictMetadata.size() - tensors
      << " bytes items), " << fileUse.size() << " files, format version "
      << printable(metadata.version.value_or("unset")) << "\n";
  auto where = [](const dcp::StorageInfo &info) {
    return "  " + printable(info.relativePath) + " @" + std::to_string(info.offset) + " +" +
           std::to_string(info.length);
  };
  for (const auto &[key, storage] : metadata.stateDictMetadata) {
    if (storage.isBytes) {
      out << "  " << printable(key) << "  bytes";
      if (const dcp::StorageInfo *found = reader.storageOf(key, std::nullopt)) {
        out << where(*found);
        if (options.values)
          out << "  = " << printable(valueText(key));
      }
      out << "\n";
      continue;
    }
    out << "  " << printable(key) << "  " << dcp::dtypeInfo(storage.properties.dtype).name << " "
        << dimsText(storage.size) << "  " << storage.chunks.size() << " chunk"
        << (storage.chunks.size() == 1 ? "" : "s") << "\n";
    for (const dcp::ChunkMetadata &chunk : storage.chunks) {
      out << "    offsets " << dimsText(chunk.offsets) << " sizes " << dimsText(chunk.sizes);
      if (const dcp::StorageInfo *found = reader.storageOf(key, chunk.offsets))
        out << where(*found);
      else
        out << "  (no storage entry)";
      out << "\n";
    }
  }
  out << "files:\n";
  for (const auto &[name, use] : fileUse)
    out << "  " << printable(name) << "  " << use.first << " items, " << use.second << " bytes\n";
  return unreadable;
}

} // namespace

Status inspectCheckpoint(const std::string &dir, Storage &storage, const InspectOptions &options,
                         std::ostream &out) {
  try {
    Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(dir, storage);
    if (!reader)
      return reader.failure();
    return describe(**reader, options, out);
  } catch (const std::bad_alloc &) {
    return makeError("out of memory while inspecting " + printable(dir), ErrorKind::IO, ENOMEM);
  }
}

} // namespace runtime
} // namespace fsdp
