//===- IntegrityIndex.h - Checksums covering every byte --------*- C++ -*-===//
//
// PyTorch DCP stores no checksums. Our checkpoints add one side file,
// `.fsdp-index`, that PyTorch never opens (its reader only follows
// `.metadata`): per item its file, byte range and xxh3-64 checksum; the
// checksum and length of `.metadata`; the identity of the plan and of the
// tool that wrote it; and a trailing xxh3-64 of the index itself. Together
// they cover every byte of a checkpoint (the 4 KiB alignment padding between
// items is covered by being zero, which `verify` checks).
//
// Layout (little-endian): "FSDPIDX1", u32 version, u64 plan id, str writer,
// u64 metadata length, u64 metadata xxh3, u64 item count, then per item
// str key, str file, u64 offset, u64 length, u64 xxh3; finally u64 xxh3 of
// every preceding byte. str = u32 length + bytes.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_FORMAT_INTEGRITYINDEX_H
#define FSDP_FORMAT_INTEGRITYINDEX_H

#include "fsdp/Support/Result.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

struct FsdpXxh3Kernels; // lib/Format/Xxh3Kernels.h

namespace fsdp {
namespace integrity {

constexpr const char *kIndexFileName = ".fsdp-index";
constexpr uint32_t kIndexVersion = 1;

struct ItemChecksum {
  std::string key;  // checkpoint key (with chunk offsets for tensors, e.g. "model.w@[4, 0]")
  std::string file; // relative to the checkpoint directory
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t xxh3 = 0;
  bool operator==(const ItemChecksum &o) const {
    return key == o.key && file == o.file && offset == o.offset && length == o.length &&
           xxh3 == o.xxh3;
  }
};

struct IntegrityIndex {
  uint64_t planId = 0;
  std::string writer;
  uint64_t metadataLength = 0;
  uint64_t metadataXxh3 = 0;
  std::vector<ItemChecksum> items;
  bool operator==(const IntegrityIndex &o) const {
    return planId == o.planId && writer == o.writer && metadataLength == o.metadataLength &&
           metadataXxh3 == o.metadataXxh3 && items == o.items;
  }
};

/// xxh3-64 of a byte range, and a streaming form for data written in pieces,
/// by the build of xxHash's code with the widest vectors this CPU runs.
uint64_t xxh3(const void *data, size_t size);
/// The builds this CPU runs, by name ("baseline" first, the one used last);
/// every one gives the same values.
std::vector<std::string> runnableXxh3Kernels();
/// xxh3-64 by the named build (one of runnableXxh3Kernels()): for tests.
uint64_t xxh3By(const std::string &kernel, const void *data, size_t size);

class StreamingXxh3 {
public:
  /// By the named build (one of runnableXxh3Kernels()); empty: the widest.
  explicit StreamingXxh3(const std::string &kernel = "");
  ~StreamingXxh3();
  StreamingXxh3(const StreamingXxh3 &) = delete;
  StreamingXxh3 &operator=(const StreamingXxh3 &) = delete;
  void update(const void *data, size_t size);
  uint64_t digest() const;

private:
  const FsdpXxh3Kernels *kernels_;
  void *state_;
};

std::string serializeIndex(const IntegrityIndex &index);
/// Parses and checks the trailing checksum; errors say what is wrong.
Result<IntegrityIndex> parseIndex(std::string_view bytes);

} // namespace integrity
} // namespace fsdp

#endif // FSDP_FORMAT_INTEGRITYINDEX_H
