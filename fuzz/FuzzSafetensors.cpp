//===- FuzzSafetensors.cpp - libFuzzer target: the safetensors reader -----===//
//
// Any input as a whole .safetensors file: the length prefix, then the header
// JSON, must fail cleanly or give tensors that lie inside the data, in the
// order of their offsets, without overlapping, each exactly as many bytes as
// its dtype and shape take. The same bytes are also read as a shard index,
// whose every file must then be a plain name.
//
// Most mutations of a whole file change the JSON's length and so only reach
// headerLength; the input is therefore also read as header JSON up to its
// first NUL byte, then data, behind a length prefix made here.
//
// With -DFSDP_FUZZ_MAKE_SEED the program instead writes the fuzzer's seeds
// into the directory argv[1]: a valid file made with layoutFile, its header
// JSON and data split by a NUL, and a shard index.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/FileName.h"
#include "fsdp/Format/Safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#ifdef FSDP_FUZZ_MAKE_SEED
namespace {

bool writeFile(const std::string &path, const std::string &bytes) {
  FILE *out = std::fopen(path.c_str(), "wb");
  if (!out)
    return false;
  std::fwrite(bytes.data(), 1, bytes.size(), out);
  return std::fclose(out) == 0;
}

} // namespace

int main(int argc, char **argv) {
  using namespace fsdp;
  if (argc != 2)
    return 2;
  // Several dtypes and ranks, a 0-d tensor and an empty one (which shares
  // its offset with the next), so mutations reach every branch.
  Result<safetensors::FileLayout> layout = safetensors::layoutFile(
      {{"model.embed_tokens.weight", dcp::DType::BFloat16, {4, 3}},
       {"model.layers.0.mlp.up_proj.weight", dcp::DType::Float32, {2, 2, 2}},
       {"model.layers.0.empty", dcp::DType::Float16, {0, 5}},
       {"model.norm.weight", dcp::DType::Float8E4M3FN, {5}},
       {"lm_head.bias", dcp::DType::Int64, {1}},
       {"step", dcp::DType::Bool, {}}},
      {{"format", "pt"}});
  if (!layout) {
    std::fprintf(stderr, "%s\n", layout.error().c_str());
    return 1;
  }
  std::string data;
  for (uint64_t at = layout->header.size(); at < layout->fileBytes; ++at)
    data.push_back(static_cast<char>(at * 7));
  std::string index = R"({"metadata": {"total_size": )" + std::to_string(data.size()) +
                      R"(}, "weight_map": {"model.embed_tokens.weight": )"
                      R"("model-00001-of-00002.safetensors", "lm_head.bias": )"
                      R"("model-00002-of-00002.safetensors"}})";
  std::string dir = argv[1];
  bool written = writeFile(dir + "/model.safetensors", layout->header + data) &&
                 writeFile(dir + "/header-then-data", layout->header.substr(8) + '\0' + data) &&
                 writeFile(dir + "/model.safetensors.index.json", index);
  return written ? 0 : 1;
}
#else
namespace {

using namespace fsdp;

/// `bytes` as a whole file, as a loader reads one.
void readAsFile(std::string_view bytes) {
  if (bytes.size() < 8)
    return;
  Result<uint64_t> length = safetensors::headerLength(bytes.data(), bytes.size());
  if (!length)
    return;
  if (*length < 2 || *length > safetensors::kMaxHeaderBytes || *length > bytes.size() - 8)
    __builtin_trap(); // the length was to be checked against the file
  Result<safetensors::FileHeader> header =
      safetensors::parseHeader(bytes.substr(8, *length), bytes.size());
  if (!header)
    return;
  if (header->dataStart != 8 + *length)
    __builtin_trap();
  std::set<std::string> names;
  const safetensors::TensorEntry *previous = nullptr, *last = nullptr;
  for (const safetensors::TensorEntry &tensor : header->tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__" || !names.insert(tensor.name).second)
      __builtin_trap();
    // Inside the data, written so that begin + bytes cannot wrap.
    if (tensor.begin < header->dataStart || tensor.begin > bytes.size() ||
        tensor.bytes > bytes.size() - tensor.begin)
      __builtin_trap();
    if (last && tensor.begin < last->begin)
      __builtin_trap(); // in the order of their offsets
    last = &tensor;
    // Exactly what the dtype and shape take (a reader copies that many).
    if (tensor.shape.size() > safetensors::kMaxDims)
      __builtin_trap();
    uint64_t expected = dcp::dtypeInfo(tensor.dtype).elementSize;
    for (int64_t size : tensor.shape)
      if (size < 0 || __builtin_mul_overflow(expected, static_cast<uint64_t>(size), &expected))
        __builtin_trap();
    if (expected != tensor.bytes)
      __builtin_trap();
    Result<std::string> dtype = safetensors::dtypeName(tensor.dtype);
    if (!dtype)
      __builtin_trap();
    Result<dcp::DType> back = safetensors::dtypeOf(*dtype);
    if (!back || *back != tensor.dtype)
      __builtin_trap();
    // Empty tensors read nothing, so only the others may not overlap.
    if (!tensor.bytes)
      continue;
    if (previous && tensor.begin < previous->begin + previous->bytes)
      __builtin_trap();
    previous = &tensor;
  }
}

/// `bytes` as header JSON up to the first NUL, then data (after the NUL).
void readAsHeader(std::string_view bytes) {
  size_t json = std::min(bytes.find('\0'), bytes.size());
  std::string file;
  for (int i = 0; i < 8; ++i)
    file.push_back(static_cast<char>(uint64_t(json) >> (8 * i)));
  file += bytes.substr(0, json);
  if (json < bytes.size())
    file += bytes.substr(json + 1);
  readAsFile(file);
}

void readAsIndex(std::string_view bytes) {
  Result<std::map<std::string, std::string>> files = safetensors::parseIndex(bytes);
  if (!files)
    return;
  for (const auto &[name, file] : *files)
    if (!isPlainFileName(file))
      __builtin_trap(); // a loader opens it inside the directory
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char *>(data), size);
  readAsFile(bytes);
  readAsHeader(bytes);
  readAsIndex(bytes);
  return 0;
}
#endif
