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
// Only the layout lives here: callers write the header and then each
// tensor's bytes at its offset, one tensor at a time, so an export holds
// about one tensor in memory.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_SAFETENSORS_H
#define FSDP_FORMAT_SAFETENSORS_H

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Support/Result.h"

#include <cstdint>
#include <map>
#include <string>
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

} // namespace safetensors
} // namespace fsdp

#endif // FSDP_FORMAT_SAFETENSORS_H
