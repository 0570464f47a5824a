//===- FuzzChunkIndex.cpp - libFuzzer target: the chunk index (.fsdp-chunks) ===//
//
// An index is opened and every key queried (all its chunks, then boxes of
// rows and of rows x columns), as a load would; everything must fail cleanly
// (kind corrupt) or answer within the key's shape. Needs no seeds: the
// first input byte chooses
//   0: the rest is an index, taken as it is;
//   1: the rest edits a valid built-in index (u24 offset, u8 xor per 4 bytes),
//   2: the same, then every hash is recomputed (a hostile writer's index:
//      only the structural checks stand in the way).
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/ChunkIndex.h"

#include <cstdint>

namespace {

using namespace fsdp;

/// A valid index: a row-sharded matrix over two files, a column-split one,
/// a vector, a 0-d step and a bytes item, with checksums; more than one
/// block of records.
const std::string &sampleIndex() {
  static const std::string bytes = [] {
    dcp::Metadata metadata;
    std::vector<integrity::ItemChecksum> sums;
    uint64_t at = 0;
    auto tensor = [&](const std::string &key, dcp::Dims shape,
                      std::vector<std::pair<dcp::Dims, dcp::Dims>> chunks) {
      dcp::StorageMetadata saved;
      saved.size = shape;
      for (auto &[offsets, sizes] : chunks) {
        std::string file = "__" + std::to_string(at % 3) + "_0.distcp";
        saved.chunks.push_back({offsets, sizes});
        metadata.storageData.push_back(
            {dcp::MetadataIndex{key, offsets, 0}, dcp::StorageInfo{file, at, 64, std::nullopt}});
        sums.push_back({key, file, at, 64, at * 31});
        at += 64;
      }
      metadata.stateDictMetadata.push_back({key, saved});
    };
    std::vector<std::pair<dcp::Dims, dcp::Dims>> rows, columns, vector;
    for (int64_t row = 0; row < 900; ++row)
      rows.push_back({{row, 0}, {1, 8}});
    for (int64_t row = 0; row < 40; row += 4) {
      columns.push_back({{row, 0}, {4, 3}});
      columns.push_back({{row, 3}, {4, 5}});
    }
    vector = {{{0}, {5}}, {{5}, {2}}};
    tensor("model.rows", {900, 8}, rows);
    tensor("model.columns", {40, 8}, columns);
    tensor("model.vector", {7}, vector);
    tensor("optimizer.state.step", {}, {{{}, {}}});
    dcp::StorageMetadata item;
    item.isBytes = true;
    metadata.stateDictMetadata.push_back({"optimizer.param_groups.0.lr", item});
    metadata.storageData.push_back(
        {dcp::MetadataIndex{"optimizer.param_groups.0.lr", std::nullopt, std::nullopt},
         dcp::StorageInfo{"__0_0.distcp", at, 64, std::nullopt}});
    sums.push_back({"optimizer.param_groups.0.lr", "__0_0.distcp", at, 64, 1});
    Result<std::string> built = chunkindex::build(metadata, &sums, 1000, 2);
    return built ? built.take() : std::string();
  }();
  return bytes;
}

void exercise(std::string bytes) {
  Result<std::unique_ptr<chunkindex::ChunkIndex>> opened =
      chunkindex::ChunkIndex::fromBytes(std::move(bytes), "fuzz");
  if (!opened)
    return;
  const chunkindex::ChunkIndex &index = **opened;
  for (uint64_t position = 0; position < index.keyCount(); ++position) {
    chunkindex::KeyInfo key = index.key(position);
    if (index.find(key.name) != position)
      __builtin_trap(); // the key table is sorted and unique
    Result<std::vector<chunkindex::Chunk>> all = index.chunks(position);
    if (!all)
      continue;
    for (const chunkindex::Chunk &chunk : *all)
      if (chunk.file >= index.fileCount() || chunk.offsets.size() != key.shape.size())
        __builtin_trap();
    if (key.shape.empty()) {
      (void)index.overlapping(position, {}, {});
      continue;
    }
    // Rows (a few boxes across the tensor), and one of other columns.
    int64_t rows = key.shape[0];
    dcp::Dims sizes = key.shape;
    dcp::Dims offsets(key.shape.size(), 0);
    for (int64_t step = 0; step < 4; ++step) {
      offsets[0] = rows / 4 * step; // not rows * step / 4: rows may be near INT64_MAX
      sizes[0] = std::max<int64_t>(1, rows / 3);
      Result<std::vector<chunkindex::Chunk>> found = index.overlapping(position, offsets, sizes);
      if (found && found->size() > all->size())
        __builtin_trap();
    }
    if (key.shape.size() > 1 && key.shape[1] > 1) {
      offsets[1] = key.shape[1] / 2;
      sizes[1] = 1;
      (void)index.overlapping(position, offsets, sizes);
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const char *rest = reinterpret_cast<const char *>(data) + 1;
  if (data[0] % 3 == 0) {
    exercise(std::string(rest, size - 1));
    return 0;
  }
  std::string bytes = sampleIndex();
  if (bytes.empty())
    __builtin_trap(); // the sample must build
  for (size_t at = 0; at + 4 <= size - 1; at += 4) {
    const uint8_t *edit = data + 1 + at;
    uint32_t offset = edit[0] | edit[1] << 8 | edit[2] << 16;
    bytes[offset % bytes.size()] ^= static_cast<char>(edit[3]);
  }
  if (data[0] % 3 == 2)
    chunkindex::resignForTesting(bytes);
  exercise(std::move(bytes));
  return 0;
}
