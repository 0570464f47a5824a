//===- Safetensors.cpp - The safetensors file layout ----------------------===//
#include "fsdp/Format/Safetensors.h"

#include <nlohmann/json.hpp>

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

} // namespace safetensors
} // namespace fsdp
