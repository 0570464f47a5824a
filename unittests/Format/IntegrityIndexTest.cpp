//===- IntegrityIndexTest.cpp - The checksum side file --------------------===//
#include "fsdp/Format/IntegrityIndex.h"

#include <gtest/gtest.h>
#include <xxhash.h> // the system's library, built apart from ours

#include <random>

using namespace fsdp::integrity;

namespace {

IntegrityIndex sampleIndex() {
  IntegrityIndex index;
  index.planId = 0xfd8c00efd65bacb3ull;
  index.writer = "fsdp-ckpt 0.1";
  index.metadataLength = 8830;
  index.metadataXxh3 = xxh3("metadata", 8);
  index.items = {{"model.p0@[0, 0]", "__0_0.distcp", 16384, 1577, xxh3("a", 1)},
                 {"optimizer.param_groups.0.lr", "__3_0.distcp", 0, 1261, xxh3("b", 1)}};
  return index;
}

TEST(IntegrityIndex, RoundTrips) {
  IntegrityIndex index = sampleIndex();
  std::string bytes = serializeIndex(index);
  fsdp::Result<IntegrityIndex> parsed = parseIndex(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.error();
  EXPECT_TRUE(*parsed == index);
  EXPECT_TRUE(parseIndex(serializeIndex(IntegrityIndex{})).ok());
}

TEST(IntegrityIndex, StreamingMatchesOneShot) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<char>(i * 7919);
  StreamingXxh3 stream;
  for (size_t at = 0; at < data.size(); at += 4096)
    stream.update(data.data() + at, std::min<size_t>(4096, data.size() - at));
  EXPECT_EQ(stream.digest(), xxh3(data.data(), data.size()));
}

// Each build of xxHash's code (baseline, AVX2, AVX-512: those this CPU runs)
// gives the system library's values, one-shot and streamed in uneven
// pieces, over every length class XXH3 treats apart (0, 1-3, 4-8, 9-16,
// 17-128, 129-240, longer: stripes, blocks of 1 KiB, a partial last one).
TEST(IntegrityIndex, EveryXxh3BuildAgrees) {
  std::vector<std::string> kernels = runnableXxh3Kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.front(), "baseline");
  // Known values of XXH3_64bits (seed 0): the empty input and "a".
  for (const std::string &kernel : kernels) {
    EXPECT_EQ(xxh3By(kernel, "", 0), 0x2d06800538d394c2ull) << kernel;
    EXPECT_EQ(xxh3By(kernel, "a", 1), 0xe6c632b61e964e1full) << kernel;
  }
  std::mt19937_64 random(7);
  std::string data(3 << 20, '\0');
  for (char &byte : data)
    byte = static_cast<char>(random());
  std::vector<size_t> lengths = {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 65536,
                                 (1u << 20) + 7, data.size()};
  for (int i = 0; i < 40; ++i)
    lengths.push_back(random() % data.size());
  for (size_t length : lengths) {
    // Not from the start of the buffer: the kernels read unaligned input.
    size_t from = (data.size() - length) ? random() % (data.size() - length) : 0;
    const char *at = data.data() + from;
    uint64_t expected = XXH3_64bits(at, length);
    for (const std::string &kernel : kernels) {
      EXPECT_EQ(xxh3By(kernel, at, length), expected) << kernel << ", " << length << " bytes";
      StreamingXxh3 stream(kernel);
      for (size_t done = 0; done < length;) {
        size_t piece = std::min<size_t>(length - done, 1 + random() % 300000);
        stream.update(at + done, piece);
        done += piece;
      }
      EXPECT_EQ(stream.digest(), expected) << kernel << ", " << length << " bytes streamed";
    }
    EXPECT_EQ(xxh3(at, length), expected) << length << " bytes";
  }
}

// Every flipped bit and every truncation is detected: the trailing checksum
// covers every byte of the index.
TEST(IntegrityIndex, DetectsEveryFlipAndTruncation) {
  std::string bytes = serializeIndex(sampleIndex());
  for (size_t at = 0; at < bytes.size(); ++at)
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = bytes;
      flipped[at] = static_cast<char>(flipped[at] ^ (1 << bit));
      EXPECT_FALSE(parseIndex(flipped).ok()) << "byte " << at << " bit " << bit;
    }
  for (size_t length = 0; length < bytes.size(); ++length)
    EXPECT_FALSE(parseIndex(bytes.substr(0, length)).ok()) << "length " << length;
}

TEST(IntegrityIndex, RejectsWhatItCannotRead) {
  fsdp::Result<IntegrityIndex> garbage = parseIndex("hello, world, this is not it");
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.error().find("bad magic"), std::string::npos);
  // A well-formed index of an unknown version (checksum fixed up).
  std::string bytes = serializeIndex(sampleIndex());
  bytes[8] = 9;
  bytes.resize(bytes.size() - 8);
  uint64_t sum = xxh3(bytes.data(), bytes.size());
  for (int i = 0; i < 8; ++i)
    bytes.push_back(static_cast<char>(sum >> (8 * i)));
  fsdp::Result<IntegrityIndex> future = parseIndex(bytes);
  ASSERT_FALSE(future.ok());
  EXPECT_NE(future.error().find("version 9 is not supported"), std::string::npos);
  // A huge item count with a valid checksum is refused, not allocated.
  IntegrityIndex empty;
  std::string small = serializeIndex(empty);
  small.resize(small.size() - 8);
  size_t countAt = small.size() - 8;
  for (int i = 0; i < 8; ++i)
    small[countAt + i] = static_cast<char>(0xff);
  uint64_t fixed = xxh3(small.data(), small.size());
  for (int i = 0; i < 8; ++i)
    small.push_back(static_cast<char>(fixed >> (8 * i)));
  fsdp::Result<IntegrityIndex> huge = parseIndex(small);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().find("claims"), std::string::npos) << huge.error();
}

} // namespace
