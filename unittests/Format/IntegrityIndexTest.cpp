//===- IntegrityIndexTest.cpp - The checksum side file --------------------===//
#include "fsdp/Format/IntegrityIndex.h"

#include <gtest/gtest.h>

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
