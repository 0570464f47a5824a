//===- IntegrityIndex.cpp - Checksums covering every byte -----------------===//
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Format/Limits.h"
#include "fsdp/Support/LittleEndian.h"

#include "Xxh3Kernels.h"

#include <cstring>
#include <new>

namespace fsdp {
namespace integrity {

namespace {
constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'I', 'D', 'X', '1'};
// Bounds that keep a corrupt index from asking for absurd allocations.
constexpr uint64_t kMaxString = limits::kMaxIndexStringBytes;

using le::putU32;
using le::putU64;
void putString(std::string &out, std::string_view text) {
  putU32(out, static_cast<uint32_t>(text.size()));
  out.append(text);
}

class Reader {
public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  bool u32(uint32_t &value) {
    if (bytes_.size() - pos_ < 4)
      return false;
    value = 0;
    for (int i = 0; i < 4; ++i)
      value |= static_cast<uint32_t>(static_cast<uint8_t>(bytes_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool u64(uint64_t &value) {
    if (bytes_.size() - pos_ < 8)
      return false;
    value = 0;
    for (int i = 0; i < 8; ++i)
      value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return true;
  }
  bool string(std::string &value) {
    uint32_t length;
    if (!u32(length) || length > kMaxString || bytes_.size() - pos_ < length)
      return false;
    value.assign(bytes_.substr(pos_, length));
    pos_ += length;
    return true;
  }
  size_t position() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

std::vector<const FsdpXxh3Kernels *> runnableKernels() {
  std::vector<const FsdpXxh3Kernels *> kernels = {&fsdpXxh3Baseline};
#if defined(__x86_64__) && defined(FSDP_XXH3_X86_KERNELS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2"))
    kernels.push_back(&fsdpXxh3Avx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    kernels.push_back(&fsdpXxh3Avx512);
#endif
  return kernels;
}

const FsdpXxh3Kernels &widestKernels() {
  static const FsdpXxh3Kernels *widest = runnableKernels().back();
  return *widest;
}

const FsdpXxh3Kernels &kernelsNamed(const std::string &name) {
  if (name.empty())
    return widestKernels();
  for (const FsdpXxh3Kernels *kernels : runnableKernels())
    if (name == kernels->name)
      return *kernels;
  return fsdpXxh3Baseline; // a name this CPU does not run: the one every CPU runs
}
} // namespace

uint64_t xxh3(const void *data, size_t size) { return widestKernels().hash(data, size); }

std::vector<std::string> runnableXxh3Kernels() {
  std::vector<std::string> names;
  for (const FsdpXxh3Kernels *kernels : runnableKernels())
    names.push_back(kernels->name);
  return names;
}

uint64_t xxh3By(const std::string &kernel, const void *data, size_t size) {
  return kernelsNamed(kernel).hash(data, size);
}

StreamingXxh3::StreamingXxh3(const std::string &kernel)
    : kernels_(&kernelsNamed(kernel)), state_(kernels_->createState()) {
  if (!state_)
    throw std::bad_alloc();
}
StreamingXxh3::~StreamingXxh3() { kernels_->freeState(state_); }
void StreamingXxh3::update(const void *data, size_t size) {
  kernels_->update(state_, data, size);
}
uint64_t StreamingXxh3::digest() const {
  return kernels_->digest(state_);
}

std::string serializeIndex(const IntegrityIndex &index) {
  std::string out(kMagic, sizeof(kMagic));
  putU32(out, kIndexVersion);
  putU64(out, index.planId);
  putString(out, index.writer);
  putU64(out, index.metadataLength);
  putU64(out, index.metadataXxh3);
  putU64(out, index.items.size());
  for (const ItemChecksum &item : index.items) {
    putString(out, item.key);
    putString(out, item.file);
    putU64(out, item.offset);
    putU64(out, item.length);
    putU64(out, item.xxh3);
  }
  putU64(out, xxh3(out.data(), out.size()));
  return out;
}

Result<IntegrityIndex> parseIndex(std::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) + 8 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return makeError("not an fsdp integrity index (bad magic)", ErrorKind::Corrupt);
  std::string_view body = bytes.substr(0, bytes.size() - 8);
  Reader tail(bytes.substr(bytes.size() - 8));
  uint64_t stored = 0;
  tail.u64(stored);
  if (xxh3(body.data(), body.size()) != stored)
    return makeError("integrity index checksum mismatch: the index is corrupt or truncated",
                     ErrorKind::Corrupt);
  Reader reader(body.substr(sizeof(kMagic)));
  IntegrityIndex index;
  uint32_t version = 0;
  uint64_t count = 0;
  if (!reader.u32(version))
    return makeError("integrity index truncated in its header", ErrorKind::Corrupt);
  if (version != kIndexVersion)
    return makeError("integrity index version " + std::to_string(version) +
                         " is not supported (this build reads version " +
                         std::to_string(kIndexVersion) + ")",
                     ErrorKind::Corrupt);
  if (!reader.u64(index.planId) || !reader.string(index.writer) ||
      !reader.u64(index.metadataLength) || !reader.u64(index.metadataXxh3) || !reader.u64(count))
    return makeError("integrity index truncated in its header", ErrorKind::Corrupt);
  // Each item takes at least 32 bytes: bound the count by what is left.
  if (count > reader.remaining() / 32)
    return makeError("integrity index claims " + std::to_string(count) +
                         " items but holds at most " + std::to_string(reader.remaining() / 32),
                     ErrorKind::Corrupt);
  index.items.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    ItemChecksum &item = index.items[i];
    if (!reader.string(item.key) || !reader.string(item.file) || !reader.u64(item.offset) ||
        !reader.u64(item.length) || !reader.u64(item.xxh3))
      return makeError("integrity index truncated in item " + std::to_string(i),
                       ErrorKind::Corrupt);
  }
  if (reader.remaining() != 0)
    return makeError("integrity index has " + std::to_string(reader.remaining()) +
                         " unexpected trailing bytes",
                     ErrorKind::Corrupt);
  return index;
}

} // namespace integrity
} // namespace fsdp
