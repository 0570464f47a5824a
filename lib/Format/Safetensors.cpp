//===- Safetensors.cpp - The safetensors file layout ----------------------===//
#include "fsdp/Format/Safetensors.h"
#include "fsdp/Format/FileName.h"
#include "fsdp/Format/Limits.h"
#include "fsdp/Support/Printable.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

namespace fsdp {
namespace safetensors {

Result<std::string> dtypeName(dcp::DType dtype) {
  switch (dtype) {
  case dcp::DType::Float64:
    return std::string("F64");
  case dcp::DType::Float32:
    return std::string("F32");
  case dcp::DType::Float16:
    return std::string("F16");
  case dcp::DType::BFloat16:
    return std::string("BF16");
  case dcp::DType::Int64:
    return std::string("I64");
  case dcp::DType::Int32:
    return std::string("I32");
  case dcp::DType::Int16:
    return std::string("I16");
  case dcp::DType::Int8:
    return std::string("I8");
  case dcp::DType::UInt8:
    return std::string("U8");
  case dcp::DType::UInt16:
    return std::string("U16");
  case dcp::DType::UInt32:
    return std::string("U32");
  case dcp::DType::UInt64:
    return std::string("U64");
  case dcp::DType::Complex64:
    return std::string("C64");
  case dcp::DType::Bool:
    return std::string("BOOL");
  case dcp::DType::Float8E4M3FN:
    return std::string("F8_E4M3");
  case dcp::DType::Float8E5M2:
    return std::string("F8_E5M2");
  case dcp::DType::Float8E4M3FNUZ:
    return std::string("F8_E4M3FNUZ");
  case dcp::DType::Float8E5M2FNUZ:
    return std::string("F8_E5M2FNUZ");
  default:
    return makeError(std::string("safetensors has no dtype for ") + dcp::dtypeInfo(dtype).name,
                     ErrorKind::Incompatible);
  }
}

Result<FileLayout> layoutFile(const std::vector<TensorSpec> &tensors,
                              const std::map<std::string, std::string> &metadata) {
  // In the order given, so the header lists tensors as the data holds them.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json strings = nlohmann::ordered_json::object();
    for (const auto &[key, value] : metadata)
      strings[key] = value;
    header["__metadata__"] = std::move(strings);
  }
  FileLayout layout;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorSpec &tensor : tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__" || !names.insert(tensor.name).second)
      return makeError("safetensors: tensor name '" + tensor.name +
                           "' is empty, reserved or repeated",
                       ErrorKind::InvalidArgument);
    Result<std::string> dtype = dtypeName(tensor.dtype);
    if (!dtype)
      return propagate(dtype, tensor.name + ": " + dtype.error());
    uint64_t bytes = dcp::dtypeInfo(tensor.dtype).elementSize;
    for (int64_t size : tensor.shape) {
      if (size < 0 || (size && bytes > UINT64_MAX / static_cast<uint64_t>(size)))
        return makeError("safetensors: " + tensor.name + " has an invalid shape",
                         ErrorKind::InvalidArgument);
      bytes *= static_cast<uint64_t>(size);
    }
    if (bytes > UINT64_MAX - offset)
      return makeError("safetensors: the file would pass 2^64 bytes", ErrorKind::InvalidArgument);
    header[tensor.name] = {
        {"dtype", *dtype}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    layout.fileOffsets.push_back(offset); // made absolute below
    layout.byteCounts.push_back(bytes);
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump(); // strict: names must be UTF-8, as JSON wants
  } catch (const nlohmann::json::exception &) {
    return makeError("safetensors: a tensor name is not valid UTF-8", ErrorKind::InvalidArgument);
  }
  // Spaces to a multiple of 8, so the data starts aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes)
    return makeError("safetensors: the header would be " + std::to_string(text.size()) +
                         " bytes, past the " + std::to_string(kMaxHeaderBytes) +
                         " readers accept (split the tensors across more files)",
                     ErrorKind::InvalidArgument);
  uint64_t length = text.size();
  for (int i = 0; i < 8; ++i)
    layout.header.push_back(static_cast<char>(length >> (8 * i)));
  layout.header += text;
  for (uint64_t &at : layout.fileOffsets)
    at += layout.header.size();
  layout.fileBytes = layout.header.size() + offset;
  return layout;
}

Result<dcp::DType> dtypeOf(const std::string &name) {
  for (unsigned value = 0; value <= static_cast<unsigned>(dcp::DType::UInt64); ++value) {
    dcp::DType dtype = static_cast<dcp::DType>(value);
    if (Result<std::string> known = dtypeName(dtype); known && *known == name)
      return dtype;
  }
  return makeError("unknown safetensors dtype '" + printable(name) + "'", ErrorKind::Incompatible);
}

namespace {

Error corrupt(const std::string &message) {
  return makeError("safetensors: " + message, ErrorKind::Corrupt);
}

/// Thrown by the parser callback to stop at once.
struct Refused {
  std::string message;
};

/// Parses `json` as an object whose values nest at most `maxDepth` deep,
/// refusing a key repeated in any object (nlohmann would keep the last).
Result<nlohmann::json> parseBounded(std::string_view json, int maxDepth, const char *what) {
  std::vector<std::set<std::string>> keys; // of each object being parsed, innermost last
  auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json &parsed) {
    using Event = nlohmann::json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) && depth > maxDepth)
      throw Refused{std::string(what) + " nests deeper than it may"};
    if (event == Event::object_start)
      keys.emplace_back();
    else if (event == Event::object_end && !keys.empty())
      keys.pop_back();
    else if (event == Event::key && !keys.empty() &&
             !keys.back().insert(parsed.get<std::string>()).second)
      throw Refused{std::string(what) + " names '" + printable(parsed.get<std::string>()) +
                    "' twice"};
    return true;
  };
  try {
    nlohmann::json parsed = nlohmann::json::parse(json.begin(), json.end(), check);
    if (!parsed.is_object())
      return corrupt(std::string(what) + " is not a JSON object");
    return parsed;
  } catch (const Refused &refused) {
    return corrupt(refused.message);
  } catch (const nlohmann::json::exception &error) {
    return corrupt(std::string(what) + " is not valid JSON (" + printable(error.what()) + ")");
  }
}

} // namespace

Result<uint64_t> headerLength(const char *prefix, uint64_t fileBytes) {
  if (fileBytes < 8)
    return corrupt("the file is " + std::to_string(fileBytes) +
                   " bytes, shorter than the 8-byte header length");
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i)
    length |= uint64_t(static_cast<uint8_t>(prefix[i])) << (8 * i);
  if (length > kMaxHeaderBytes)
    return corrupt("the header length " + std::to_string(length) + " passes the " +
                   std::to_string(kMaxHeaderBytes) + " bytes readers accept");
  if (length > fileBytes - 8)
    return corrupt("the header length " + std::to_string(length) + " passes the end of the " +
                   std::to_string(fileBytes) + "-byte file");
  if (length < 2)
    return corrupt("the header is " + std::to_string(length) + " bytes: no JSON object");
  return length;
}

Result<FileHeader> parseHeader(std::string_view json, uint64_t fileBytes) {
  if (json.size() > kMaxHeaderBytes || json.size() > fileBytes || fileBytes - json.size() < 8)
    return corrupt("the header does not fit the file");
  // The top object, each tensor's object, its shape and offsets arrays.
  Result<nlohmann::json> parsed = parseBounded(json, 2, "the header");
  if (!parsed)
    return parsed.failure();
  FileHeader header;
  header.dataStart = 8 + json.size();
  uint64_t dataBytes = fileBytes - header.dataStart;
  for (const auto &[name, value] : parsed->items()) {
    std::string shown = "'" + printable(name) + "'";
    if (name == "__metadata__") {
      if (!value.is_object())
        return corrupt("__metadata__ is not an object");
      for (const auto &[key, text] : value.items()) {
        if (!text.is_string())
          return corrupt("__metadata__ '" + printable(key) + "' is not a string");
        header.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    if (name.empty() || name.size() > limits::kMaxKeyBytes)
      return corrupt("a tensor name is empty or too long");
    if (!value.is_object())
      return corrupt(shown + " is not an object");
    const auto dtype = value.find("dtype"), shape = value.find("shape"),
               offsets = value.find("data_offsets");
    if (dtype == value.end() || !dtype->is_string() || shape == value.end() ||
        !shape->is_array() || offsets == value.end() || !offsets->is_array() ||
        offsets->size() != 2 || value.size() != 3)
      return corrupt(shown + " needs exactly dtype (a string), shape and data_offsets "
                     "(an array of 2)");
    TensorEntry entry;
    entry.name = name;
    Result<dcp::DType> known = dtypeOf(dtype->get<std::string>());
    if (!known)
      return propagate(known, "safetensors: " + shown + ": " + known.error());
    entry.dtype = *known;
    if (shape->size() > kMaxDims)
      return corrupt(shown + " has " + std::to_string(shape->size()) + " dimensions, more than " +
                     std::to_string(kMaxDims));
    uint64_t bytes = dcp::dtypeInfo(entry.dtype).elementSize;
    bool overflow = false;
    for (const nlohmann::json &size : *shape) {
      if (!size.is_number_unsigned() || size.get<uint64_t>() > uint64_t(INT64_MAX))
        return corrupt(shown + " has a dimension that is not a non-negative integer");
      uint64_t dim = size.get<uint64_t>();
      entry.shape.push_back(static_cast<int64_t>(dim));
      overflow = overflow || __builtin_mul_overflow(bytes, dim, &bytes);
    }
    const nlohmann::json &first = (*offsets)[0], &last = (*offsets)[1];
    if (!first.is_number_unsigned() || !last.is_number_unsigned())
      return corrupt(shown + " has data_offsets that are not non-negative integers");
    uint64_t begin = first.get<uint64_t>(), end = last.get<uint64_t>();
    if (begin > end || end > dataBytes)
      return corrupt(shown + " has data_offsets [" + std::to_string(begin) + ", " +
                     std::to_string(end) + ") outside the file's " + std::to_string(dataBytes) +
                     " data bytes");
    if (overflow || bytes != end - begin)
      return corrupt(shown + " is " + std::to_string(end - begin) +
                     " bytes in the file, not what its dtype and shape take");
    entry.begin = header.dataStart + begin;
    entry.bytes = bytes;
    header.tensors.push_back(std::move(entry));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry &a, const TensorEntry &b) {
              return a.begin != b.begin ? a.begin < b.begin : a.bytes < b.bytes;
            });
  // The tensors tile the data exactly, as the format requires: no overlap,
  // no byte that belongs to no tensor (a polyglot file hides one there).
  const TensorEntry *previous = nullptr;
  uint64_t end = header.dataStart;
  for (const TensorEntry &entry : header.tensors) {
    if (entry.begin < end && entry.bytes)
      return corrupt("'" + printable(entry.name) + "' and '" + printable(previous->name) +
                     "' overlap in the file");
    if (entry.begin > end)
      return corrupt("bytes [" + std::to_string(end - header.dataStart) + ", " +
                     std::to_string(entry.begin - header.dataStart) +
                     ") of the data belong to no tensor");
    end = std::max(end, entry.begin + entry.bytes);
    previous = &entry;
  }
  if (end != fileBytes)
    return corrupt(std::to_string(fileBytes - end) + " bytes after the last tensor");
  return header;
}

Result<std::map<std::string, std::string>> parseIndex(std::string_view json) {
  if (json.size() > kMaxIndexBytes)
    return corrupt("the index is " + std::to_string(json.size()) + " bytes, more than the " +
                   std::to_string(kMaxIndexBytes) + " read");
  // The top object, weight_map and metadata (whose values may be objects).
  Result<nlohmann::json> parsed = parseBounded(json, 3, "the index");
  if (!parsed)
    return parsed.failure();
  const auto map = parsed->find("weight_map");
  if (map == parsed->end() || !map->is_object())
    return corrupt("the index has no weight_map object");
  std::map<std::string, std::string> files;
  for (const auto &[name, file] : map->items()) {
    if (!file.is_string() || !isPlainFileName(file.get<std::string>()))
      return corrupt("the index puts '" + printable(name) +
                     "' in something that is not a plain file name of the directory");
    files[name] = file.get<std::string>();
  }
  return files;
}

} // namespace safetensors
} // namespace fsdp
