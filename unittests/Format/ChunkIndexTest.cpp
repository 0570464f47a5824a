//===- ChunkIndexTest.cpp - The compact chunk index (.fsdp-chunks) --------===//
#include "fsdp/Format/ChunkIndex.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

using namespace fsdp;
using namespace fsdp::chunkindex;

namespace {

// Header fields the tests edit (docs/CheckpointFormat.md, `.fsdp-chunks`).
constexpr size_t kKeyCountField = 24, kRecordCountField = 40, kKeyTableField = 72,
                 kBlockTableField = 96, kRecordField = 104;

uint64_t getU64(const std::string &bytes, size_t at) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i)
    value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  return value;
}
void setU64(std::string &bytes, size_t at, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    bytes[at + i] = static_cast<char>(value >> (8 * i));
}

/// Adds tensor `key` of `shape` with `chunks` (offsets, sizes), items laid
/// out in `file` from `at`, and their checksums.
void addTensor(dcp::Metadata &metadata, std::vector<integrity::ItemChecksum> &sums,
               const std::string &key, dcp::Dims shape,
               const std::vector<std::pair<dcp::Dims, dcp::Dims>> &chunks, const std::string &file,
               uint64_t &at) {
  dcp::StorageMetadata saved;
  saved.properties.dtype = dcp::DType::BFloat16;
  saved.size = std::move(shape);
  for (const auto &[offsets, sizes] : chunks) {
    saved.chunks.push_back({offsets, sizes});
    metadata.storageData.push_back(
        {dcp::MetadataIndex{key, offsets, static_cast<int64_t>(saved.chunks.size() - 1)},
         dcp::StorageInfo{file, at, 1577, std::nullopt}});
    sums.push_back({key, file, at, 1577, integrity::xxh3(&at, sizeof(at))});
    at += 4096;
  }
  metadata.stateDictMetadata.push_back({key, std::move(saved)});
}

struct Sample {
  dcp::Metadata metadata;
  std::vector<integrity::ItemChecksum> sums;
};

/// model.w [10, 4] in rows 0-3 / 3-7 / 7-10, model.b [5] in two, a 0-d step
/// and a bytes item, over two files.
Sample sample() {
  Sample s;
  uint64_t at0 = 0, at1 = 0;
  addTensor(s.metadata, s.sums, "model.w", {10, 4},
            {{{7, 0}, {3, 4}}, {{0, 0}, {3, 4}}, {{3, 0}, {4, 4}}}, "__0_0.distcp", at0);
  addTensor(s.metadata, s.sums, "model.b", {5}, {{{0}, {2}}, {{2}, {3}}}, "__1_0.distcp", at1);
  addTensor(s.metadata, s.sums, "optimizer.state.w.step", {}, {{{}, {}}}, "__1_0.distcp", at1);
  dcp::StorageMetadata bytes;
  bytes.isBytes = true;
  s.metadata.stateDictMetadata.push_back({"optimizer.param_groups.0.lr", bytes});
  s.metadata.storageData.push_back(
      {dcp::MetadataIndex{"optimizer.param_groups.0.lr", std::nullopt, std::nullopt},
       dcp::StorageInfo{"__0_0.distcp", at0, 1261, std::nullopt}});
  s.sums.push_back({"optimizer.param_groups.0.lr", "__0_0.distcp", at0, 1261, 42});
  return s;
}

std::string built(const Sample &s, bool withSums = true) {
  Result<std::string> bytes = build(s.metadata, withSums ? &s.sums : nullptr, 777, 0xabc);
  EXPECT_TRUE(bytes.ok()) << bytes.error();
  return bytes ? bytes.take() : std::string();
}

std::unique_ptr<ChunkIndex> opened(std::string bytes) {
  // Through a ByteSource, as a reader opens the file (blocks read lazily).
  auto owned = std::make_shared<std::string>(std::move(bytes));
  struct Source : zip::MemorySource {
    std::shared_ptr<std::string> keep;
    explicit Source(std::shared_ptr<std::string> bytes) : MemorySource(*bytes), keep(bytes) {}
  };
  Result<std::unique_ptr<ChunkIndex>> index =
      ChunkIndex::open(std::make_unique<Source>(owned), "ckpt/.fsdp-chunks");
  EXPECT_TRUE(index.ok()) << index.error();
  return index ? index.take() : nullptr;
}

std::vector<dcp::Dims> offsetsOf(const std::vector<Chunk> &chunks) {
  std::vector<dcp::Dims> out;
  for (const Chunk &chunk : chunks)
    out.push_back(chunk.offsets);
  return out;
}

/// Every key's every chunk, through every block: fails where any is damaged.
Status readEverything(const ChunkIndex &index) {
  for (uint64_t key = 0; key < index.keyCount(); ++key)
    if (Result<std::vector<Chunk>> chunks = index.chunks(key); !chunks)
      return chunks.failure();
  return Status::success();
}

TEST(ChunkIndex, RoundTrips) {
  Sample s = sample();
  std::unique_ptr<ChunkIndex> index = opened(built(s));
  ASSERT_TRUE(index);
  EXPECT_TRUE(index->hasChecksums());
  EXPECT_EQ(index->metadataLength(), 777u);
  EXPECT_EQ(index->metadataXxh3(), 0xabcu);
  EXPECT_EQ(index->keyCount(), 4u);
  EXPECT_EQ(index->recordCount(), 7u);
  ASSERT_EQ(index->fileCount(), 2u);
  EXPECT_EQ(index->fileName(0), "__0_0.distcp");
  EXPECT_EQ(index->fileName(1), "__1_0.distcp");
  EXPECT_FALSE(index->find("model.x"));
  EXPECT_FALSE(index->find(""));

  std::optional<uint64_t> w = index->find("model.w");
  ASSERT_TRUE(w);
  KeyInfo info = index->key(*w);
  EXPECT_EQ(info.name, "model.w");
  EXPECT_FALSE(info.isBytes);
  EXPECT_EQ(info.dtype, dcp::DType::BFloat16);
  EXPECT_EQ(info.shape, (dcp::Dims{10, 4}));
  EXPECT_EQ(info.chunkCount, 3u);
  // Sorted by offsets, whatever order `.metadata` listed them in; each with
  // its item and the digest `.fsdp-index` holds.
  Result<std::vector<Chunk>> chunks = index->chunks(*w);
  ASSERT_TRUE(chunks.ok()) << chunks.error();
  ASSERT_EQ(chunks->size(), 3u);
  EXPECT_EQ(offsetsOf(*chunks), (std::vector<dcp::Dims>{{0, 0}, {3, 0}, {7, 0}}));
  EXPECT_EQ((*chunks)[1].sizes, (dcp::Dims{4, 4}));
  EXPECT_EQ(index->fileName((*chunks)[1].file), "__0_0.distcp");
  EXPECT_EQ((*chunks)[1].itemOffset, 8192u); // listed third: the third item
  EXPECT_EQ((*chunks)[1].itemLength, 1577u);
  uint64_t at = 8192;
  EXPECT_EQ((*chunks)[1].xxh3, integrity::xxh3(&at, sizeof(at)));

  std::optional<uint64_t> lr = index->find("optimizer.param_groups.0.lr");
  ASSERT_TRUE(lr);
  EXPECT_TRUE(index->key(*lr).isBytes);
  Result<std::vector<Chunk>> item = index->overlapping(*lr, {}, {});
  ASSERT_TRUE(item.ok());
  ASSERT_EQ(item->size(), 1u);
  EXPECT_EQ((*item)[0].itemLength, 1261u);
  EXPECT_EQ((*item)[0].xxh3, 42u);

  // Held whole in memory, and without checksums: the same answers.
  Result<std::unique_ptr<ChunkIndex>> whole = ChunkIndex::fromBytes(built(s), "m");
  ASSERT_TRUE(whole.ok()) << whole.error();
  EXPECT_EQ(offsetsOf(*(*whole)->chunks(*w)), offsetsOf(*chunks));
  std::unique_ptr<ChunkIndex> bare = opened(built(s, false));
  ASSERT_TRUE(bare);
  EXPECT_FALSE(bare->hasChecksums());
  EXPECT_EQ((*bare->chunks(*w))[1].xxh3, 0u);
  // Deterministic: the same inputs give the same bytes (verify relies on it).
  EXPECT_EQ(built(s), built(s));
}

TEST(ChunkIndex, Queries) {
  std::unique_ptr<ChunkIndex> index = opened(built(sample()));
  ASSERT_TRUE(index);
  uint64_t w = *index->find("model.w"), b = *index->find("model.b");
  auto rows = [&](int64_t begin, int64_t end) {
    Result<std::vector<Chunk>> found = index->overlapping(w, {begin, 0}, {end - begin, 4});
    EXPECT_TRUE(found.ok());
    return found ? offsetsOf(*found) : std::vector<dcp::Dims>();
  };
  EXPECT_EQ(rows(2, 5), (std::vector<dcp::Dims>{{0, 0}, {3, 0}}));
  EXPECT_EQ(rows(3, 7), (std::vector<dcp::Dims>{{3, 0}}));
  EXPECT_EQ(rows(6, 8), (std::vector<dcp::Dims>{{3, 0}, {7, 0}}));
  EXPECT_EQ(rows(9, 10), (std::vector<dcp::Dims>{{7, 0}}));
  EXPECT_EQ(rows(0, 10).size(), 3u);
  EXPECT_TRUE(rows(10, 12).empty());
  EXPECT_TRUE(rows(4, 4).empty()); // an empty box
  // A column range overlaps every row chunk in its rows.
  EXPECT_EQ(offsetsOf(*index->overlapping(w, {1, 3}, {5, 1})),
            (std::vector<dcp::Dims>{{0, 0}, {3, 0}}));
  // A box of another rank than the key's overlaps nothing.
  EXPECT_TRUE(index->overlapping(w, {0}, {10})->empty());
  EXPECT_EQ(index->overlapping(b, {1}, {2})->size(), 2u);
  uint64_t step = *index->find("optimizer.state.w.step");
  EXPECT_EQ(index->overlapping(step, {}, {})->size(), 1u);
  EXPECT_TRUE(index->key(step).shape.empty());
}

/// Random tilings (rows, or rows x columns) of tensors with thousands of
/// chunks across many blocks, random boxes: the index answers exactly what
/// testing every chunk answers, touching few blocks, from many threads.
TEST(ChunkIndex, MatchesBruteForce) {
  std::mt19937_64 random(20261129);
  Sample s;
  uint64_t at = 0;
  std::vector<std::vector<std::pair<dcp::Dims, dcp::Dims>>> tilings;
  const int64_t rows = 100000, columns = 64;
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<std::pair<dcp::Dims, dcp::Dims>> chunks;
    for (int64_t row = 0; row < rows;) {
      int64_t height = std::min<int64_t>(rows - row, 1 + random() % 60);
      if (kind == 0) {
        chunks.push_back({{row, 0}, {height, columns}});
      } else {
        int64_t split = 1 + random() % (columns - 1);
        chunks.push_back({{row, 0}, {height, split}});
        chunks.push_back({{row, split}, {height, columns - split}});
      }
      row += height;
    }
    std::shuffle(chunks.begin(), chunks.end(), random);
    addTensor(s.metadata, s.sums, kind ? "model.columns" : "model.rows", {rows, columns}, chunks,
              "__0_0.distcp", at);
    tilings.push_back(chunks);
  }
  std::unique_ptr<ChunkIndex> index = opened(built(s));
  ASSERT_TRUE(index);
  uint64_t blocks = (index->recordCount() + kRecordsPerBlock - 1) / kRecordsPerBlock;
  ASSERT_GT(blocks, 10u);

  // One narrow query reads a handful of blocks, not the records section.
  uint64_t rowsKey = *index->find("model.rows");
  ASSERT_TRUE(index->overlapping(rowsKey, {5000, 0}, {10, columns}).ok());
  EXPECT_LE(index->blocksRead(), 12u);
  EXPECT_LT(index->bytesRead(), 12 * kRecordsPerBlock * kRecordSize);

  auto check = [&](unsigned seed, int queries, bool &ok) {
    std::mt19937_64 mine(seed);
    for (int q = 0; q < queries; ++q) {
      int kind = mine() % 2;
      int64_t begin = mine() % rows, height = 1 + mine() % 300;
      int64_t column = mine() % columns, width = 1 + mine() % (columns - column);
      dcp::Dims offsets{begin, column}, sizes{std::min(height, rows - begin), width};
      std::vector<dcp::Dims> expected;
      for (const auto &[o, z] : tilings[kind]) {
        bool overlaps = true;
        for (int d = 0; d < 2; ++d)
          overlaps = overlaps && o[d] < offsets[d] + sizes[d] && offsets[d] < o[d] + z[d];
        if (overlaps)
          expected.push_back(o);
      }
      std::sort(expected.begin(), expected.end());
      Result<std::vector<Chunk>> found =
          index->overlapping(*index->find(kind ? "model.columns" : "model.rows"), offsets, sizes);
      if (!found || offsetsOf(*found) != expected)
        ok = false;
    }
  };
  std::vector<std::thread> threads;
  bool ok[8] = {true, true, true, true, true, true, true, true};
  for (unsigned t = 0; t < 8; ++t)
    threads.emplace_back(check, t, 200, std::ref(ok[t]));
  for (std::thread &thread : threads)
    thread.join();
  for (bool each : ok)
    EXPECT_TRUE(each);
  EXPECT_LE(index->blocksRead(), blocks);
}

TEST(ChunkIndex, BuildRefusesWhatItCannotHold) {
  Sample s = sample();
  uint64_t at = 1 << 20;
  addTensor(s.metadata, s.sums, "model.conv3d", {2, 2, 2, 2, 2},
            {{{0, 0, 0, 0, 0}, {2, 2, 2, 2, 2}}}, "__0_0.distcp", at);
  Result<std::string> fiveDims = build(s.metadata, &s.sums, 0, 0);
  ASSERT_FALSE(fiveDims.ok());
  EXPECT_EQ(fiveDims.kind(), ErrorKind::Incompatible);
  EXPECT_NE(fiveDims.error().find("model.conv3d has 5 dimensions"), std::string::npos);

  Sample missing = sample();
  missing.sums.pop_back();
  Result<std::string> noSum = build(missing.metadata, &missing.sums, 0, 0);
  ASSERT_FALSE(noSum.ok());
  EXPECT_EQ(noSum.kind(), ErrorKind::InvalidArgument);
  EXPECT_NE(noSum.error().find("no checksum for the item of optimizer.param_groups.0.lr"),
            std::string::npos);
}

Error openFailure(std::string bytes) {
  Result<std::unique_ptr<ChunkIndex>> index = ChunkIndex::fromBytes(std::move(bytes), "c");
  EXPECT_FALSE(index.ok());
  return index ? Error{} : index.failure();
}

/// The error of the first query that fails once the index opened.
Error queryFailure(std::string bytes) {
  Result<std::unique_ptr<ChunkIndex>> index = ChunkIndex::fromBytes(std::move(bytes), "c");
  EXPECT_TRUE(index.ok()) << index.error();
  if (!index)
    return index.failure();
  Status status = readEverything(**index);
  EXPECT_FALSE(status.ok());
  return status ? Error{} : status.failure();
}

TEST(ChunkIndex, RefusesTruncatedAndAlteredHeaders) {
  std::string good = built(sample());
  for (size_t length :
       {size_t(0), size_t(7), size_t(127), size_t(128), good.size() / 2, good.size() - 1}) {
    Error error = openFailure(good.substr(0, length));
    EXPECT_EQ(error.kind, ErrorKind::Corrupt) << length;
    EXPECT_NE(error.message.find("(the chunk index is corrupt)"), std::string::npos)
        << error.message;
  }
  EXPECT_NE(openFailure(good + std::string(96, '\0')).message.find("do not fit"),
            std::string::npos);
  std::string magic = good;
  magic[0] = 'X';
  EXPECT_NE(openFailure(magic).message.find("bad magic"), std::string::npos);
  std::string version = good;
  version[8] = 2;
  chunkindex::resignForTesting(version);
  EXPECT_NE(openFailure(version).message.find("version 2 is not supported"), std::string::npos);
  // Counts that do not fit the file, re-signed or not.
  for (uint64_t keys : {uint64_t(5), uint64_t(1) << 40, UINT64_MAX}) {
    std::string counted = good;
    setU64(counted, kKeyCountField, keys);
    chunkindex::resignForTesting(counted);
    Error error = openFailure(counted);
    EXPECT_EQ(error.kind, ErrorKind::Corrupt);
    EXPECT_NE(error.message.find("do not fit"), std::string::npos) << error.message;
  }
  std::string records = good;
  setU64(records, kRecordCountField, UINT64_MAX / 96);
  EXPECT_EQ(openFailure(records).kind, ErrorKind::Corrupt);
  // A flipped byte of the directory: its checksum.
  std::string flipped = good;
  flipped[200] ^= 1;
  EXPECT_NE(openFailure(flipped).message.find("checksum mismatch in its header and tables"),
            std::string::npos);
}

TEST(ChunkIndex, RefusesLyingTables) {
  std::string good = built(sample());
  uint64_t keyTable = getU64(good, kKeyTableField);
  // model.b is key 0 (sorted), model.w key 1.
  std::string name = good;
  setU64(name, keyTable, uint64_t(1) << 62); // name offset past the pool
  chunkindex::resignForTesting(name);
  EXPECT_NE(openFailure(name).message.find("key 0: its name lies outside the string pool"),
            std::string::npos);
  std::string range = good;
  setU64(range, keyTable + 56, 99); // model.b's record range ends past the records
  chunkindex::resignForTesting(range);
  EXPECT_NE(openFailure(range).message.find("key 0: its record range"), std::string::npos);
  std::string shape = good;
  setU64(shape, keyTable + 16, uint64_t(-5)); // a negative dimension
  chunkindex::resignForTesting(shape);
  EXPECT_NE(openFailure(shape).message.find("key 0: bad shape"), std::string::npos);
  std::string maxRows = good;
  setU64(maxRows, keyTable + 64, 6); // more rows than the tensor
  chunkindex::resignForTesting(maxRows);
  EXPECT_NE(openFailure(maxRows).message.find("bad largest chunk size"), std::string::npos);
  uint64_t pool = getU64(good, 88);
  std::string path = good; // "__0/0.distcp": a path, not a name in the directory
  path[pool + 63 + 3] = '/';
  chunkindex::resignForTesting(path);
  EXPECT_NE(openFailure(path).message.find("file 0: not a plain name"), std::string::npos);
  std::string order = good; // swap the first letters of two names: unsorted keys
  std::swap(order[pool + 6], order[pool + 7 + 6]);
  chunkindex::resignForTesting(order);
  EXPECT_EQ(openFailure(order).kind, ErrorKind::Corrupt);
}

TEST(ChunkIndex, RefusesLyingRecordsWhenRead) {
  std::string good = built(sample());
  uint64_t records = getU64(good, kRecordField);
  // Records: model.b [0], model.b [2], model.w [0,0], [3,0], [7,0], lr, step.
  auto record = [&](uint64_t index) { return records + index * kRecordSize; };
  std::string file = good;
  setU64(file, record(2) + 64, 7); // file index 7 of 2
  chunkindex::resignForTesting(file);
  EXPECT_NE(queryFailure(file).message.find("record 2 (model.w): its file index is out of range"),
            std::string::npos);
  std::string outside = good;
  setU64(outside, record(4), 8); // rows [8, 11) of 10
  chunkindex::resignForTesting(outside);
  EXPECT_NE(queryFailure(outside).message.find("outside the tensor"), std::string::npos);
  std::string unsorted = good;
  std::swap_ranges(unsorted.begin() + record(2), unsorted.begin() + record(3),
                   unsorted.begin() + record(3));
  chunkindex::resignForTesting(unsorted);
  EXPECT_NE(queryFailure(unsorted).message.find("not sorted by offsets"), std::string::npos);
  std::string offset = good;
  setU64(offset, record(2) + 72, UINT64_MAX - 10); // the item's end overflows
  chunkindex::resignForTesting(offset);
  EXPECT_NE(queryFailure(offset).message.find("overflows"), std::string::npos);
  // A damaged record block, not re-signed: found when the block is read.
  std::string flipped = good;
  flipped[record(3) + 5] ^= 0x40;
  Error error = queryFailure(flipped);
  EXPECT_EQ(error.kind, ErrorKind::Corrupt);
  EXPECT_EQ(error.message, "c: checksum mismatch in record block 0 (records from 0) (the chunk "
                           "index is corrupt)");
}

// Records sorted within each block but not across a block boundary: the
// block table's fences order the blocks.
TEST(ChunkIndex, RefusesRecordsUnsortedAcrossBlocks) {
  Sample s;
  uint64_t at = 0;
  std::vector<std::pair<dcp::Dims, dcp::Dims>> chunks;
  for (int64_t row = 0; row < 4000; ++row)
    chunks.push_back({{row}, {1}});
  addTensor(s.metadata, s.sums, "model.v", {4000}, chunks, "__0_0.distcp", at);
  std::string good = built(s);
  uint64_t table = getU64(good, kBlockTableField);
  EXPECT_EQ(getU64(good, table + 16 + 8), kRecordsPerBlock); // block 1's first row
  // Swap the last record of block 0 and the first of block 1.
  std::string swapped = good;
  uint64_t last = getU64(good, kRecordField) + (kRecordsPerBlock - 1) * kRecordSize;
  std::swap_ranges(swapped.begin() + last, swapped.begin() + last + kRecordSize,
                   swapped.begin() + last + kRecordSize);
  chunkindex::resignForTesting(swapped);
  Result<std::unique_ptr<ChunkIndex>> index = ChunkIndex::fromBytes(swapped, "c");
  ASSERT_TRUE(index.ok());
  // One query reads block 4 alone, another block 1, which no longer starts
  // at its fence.
  EXPECT_TRUE((*index)->overlapping(0, {3000}, {5}).ok());
  EXPECT_EQ((*index)->blocksRead(), 1u);
  Result<std::vector<Chunk>> crossing =
      (*index)->overlapping(0, {int64_t(kRecordsPerBlock) + 20}, {5});
  ASSERT_FALSE(crossing.ok());
  EXPECT_NE(crossing.error().find("record " + std::to_string(kRecordsPerBlock) +
                                  " (model.v): it does not start at its block's first"),
            std::string::npos)
      << crossing.error();
  // With the fence moved too, block 0 goes past it.
  setU64(swapped, table + 16 + 8, kRecordsPerBlock - 1);
  chunkindex::resignForTesting(swapped);
  index = ChunkIndex::fromBytes(swapped, "c");
  ASSERT_TRUE(index.ok());
  EXPECT_TRUE((*index)->overlapping(0, {int64_t(kRecordsPerBlock) + 20}, {5}).ok());
  Result<std::vector<Chunk>> early = (*index)->overlapping(0, {100}, {5});
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.error().find("record " + std::to_string(kRecordsPerBlock - 1) +
                               " (model.v): it starts past the next block's first row"),
            std::string::npos)
      << early.error();
  // Fences out of order are refused at open.
  std::string fences = good;
  setU64(fences, table + 2 * 16 + 8, 5);
  chunkindex::resignForTesting(fences);
  EXPECT_NE(openFailure(fences).message.find("block 2: its first row 5 is out of order"),
            std::string::npos);
}

// Every single-bit flip of a small index is caught: at open (directory) or
// when its record block is read.
TEST(ChunkIndex, DetectsEveryFlip) {
  std::string good = built(sample());
  for (size_t at = 0; at < good.size(); ++at)
    for (int bit = 0; bit < 8; bit += 3) {
      std::string flipped = good;
      flipped[at] = static_cast<char>(flipped[at] ^ (1 << bit));
      Result<std::unique_ptr<ChunkIndex>> index = ChunkIndex::fromBytes(flipped, "c");
      bool caught = !index || !readEverything(**index);
      // Padding before the records is covered by the directory hash.
      EXPECT_TRUE(caught) << "byte " << at << " bit " << bit;
    }
}

} // namespace
