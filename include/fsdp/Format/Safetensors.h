//===- Safetensors.h - The safetensors file layout --------------*- C++ -*-===//
//
// What Hugging Face `transformers`, vLLM and SGLang read weights from: an
// 8-byte little-endian header length N, then N bytes of JSON (padded with
// spaces so that the data starts 8-byte aligned) mapping each tensor's name
// to its dtype, shape and `data_offsets` [begin, end) relative to the end
// of the header, plus a `__metadata__` object of strings; then the tensors'
// bytes back to back, in the order of their offsets, with no gaps and no
// overlaps (C order, little-endian). Readers refuse headers over 100 MB.
//
// The layout lives here, both ways: layoutFile for a writer (who writes the
// header and then each tensor's bytes at its offset, one tensor at a time,
// so an export holds about one tensor in memory), parseHeader and
// parseIndex for a reader. The reader treats every file as hostile: the
// header's length is checked against the file before it is read, the JSON
// is bounded in size and depth, every tensor's offsets lie in the file and
// match its dtype and shape, the tensors tile the data exactly (no overlap,
// no hole, nothing after the last), no name repeats, and a shard index
// names plain files only.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_SAFETENSORS_H
#define FSDP_FORMAT_SAFETENSORS_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Support/Result.h"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {
namespace safetensors {

/// The largest header safetensors' readers accept.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// The safetensors name of a dtype ("F32", "BF16", ...); an error (kind
/// Incompatible) for dtypes safetensors has no name for (complex).
Result<std::string> dtypeName(dcp::DType dtype);

struct TensorSpec {
  std::string name;
  dcp::DType dtype = dcp::DType::Float32;
  dcp::Dims shape;
};

struct FileLayout {
  /// The length prefix and the padded JSON: the file's first bytes.
  std::string header;
  /// Per tensor, in the order given: where its bytes start in the file, and
  /// how many there are.
  std::vector<uint64_t> fileOffsets, byteCounts;
  /// The whole file's size.
  uint64_t fileBytes = 0;
};

/// The layout of one file holding `tensors` back to back in the order
/// given, with `metadata` (e.g. {"format": "pt"}, which transformers
/// expects). Fails for an empty or repeated name, a negative dimension, a
/// dtype without a safetensors name, or a header past kMaxHeaderBytes.
Result<FileLayout> layoutFile(const std::vector<TensorSpec> &tensors,
                              const std::map<std::string, std::string> &metadata);

/// The dtype of a safetensors name; an error (kind Incompatible) for names
/// this reader does not know.
Result<dcp::DType> dtypeOf(const std::string &name);

/// The most dimensions a tensor of a file may have.
constexpr size_t kMaxDims = 64;

/// One tensor of a file, as its header says.
struct TensorEntry {
  std::string name;
  dcp::DType dtype = dcp::DType::Float32;
  dcp::Dims shape;
  /// Where its bytes lie in the file: [begin, begin + bytes).
  uint64_t begin = 0, bytes = 0;
};

struct FileHeader {
  /// In the order of their offsets.
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  /// Where the data starts: 8 + the header's length.
  uint64_t dataStart = 0;
};

/// The header's length from the file's first 8 bytes, checked against the
/// file's size and kMaxHeaderBytes (kind Corrupt otherwise). `fileBytes`
/// under 8 is a truncated file.
Result<uint64_t> headerLength(const char *prefix, uint64_t fileBytes);

/// Parses and checks the header JSON (`json`, headerLength() bytes read
/// after the prefix) of a file of `fileBytes`: every tensor a known dtype,
/// a shape of at most kMaxDims non-negative dimensions whose bytes match
/// its `data_offsets`, inside the data; no repeated name; the tensors tile
/// the data exactly; `__metadata__` an object of strings. Errors (kind Corrupt,
/// Incompatible for an unknown dtype) name the tensor.
Result<FileHeader> parseHeader(std::string_view json, uint64_t fileBytes);

/// The largest `model.safetensors.index.json` read.
constexpr uint64_t kMaxIndexBytes = uint64_t(64) << 20;

/// `weight_map` of a shard index: tensor name -> file, every file a plain
/// name (no directory, not `.` or `..`). Errors (kind Corrupt) say what is
/// wrong.
Result<std::map<std::string, std::string>> parseIndex(std::string_view json);

} // namespace safetensors
} // namespace fsdp

#endif // FSDP_FORMAT_SAFETENSORS_H
