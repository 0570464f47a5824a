//===- IoTest.cpp - The write queue and direct reads ----------------------===//
//
// The save's queue of direct writes (blocks land at their offsets, a failed
// write stops it and is reported, nothing in flight outlives it), the
// blocks a checkpointer keeps for its saves (reused, replaced by more when a
// save needs more, bad sizes refused) and the
// cold-cache reads of a file with direct I/O (every byte in order, into
// the destination or not, and a file that shrinks is an error).
//
//===----------------------------------------------------------------------===//

#include "../../runtime/WriteQueue.h"
#include "fsdp/Runtime/FileSource.h"
#include "fsdp/Runtime/Storage.h"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

using namespace fsdp;
using namespace fsdp::runtime;

namespace {

std::string tempDir() {
  const char *base = std::getenv("TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/fsdp-io-XXXXXX";
  return ::mkdtemp(pattern.data()) ? pattern : "";
}

std::string slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

/// Bytes that differ at every position (a misplaced block shows).
std::string pattern(uint64_t size, uint32_t seed) {
  std::string bytes(size, '\0');
  uint32_t state = seed;
  for (char &byte : bytes) {
    state = state * 1664525u + 1013904223u;
    byte = static_cast<char>(state >> 24);
  }
  return bytes;
}

constexpr uint64_t kBlock = 64 << 10;

TEST(WriteQueue, BlocksLandAtTheirOffsetsInAnyOrder) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  auto storage = createPosixStorage();
  auto file = storage->createDirect(dir + "/data");
  ASSERT_TRUE(file) << file.error();
  std::string expected = pattern(40 * kBlock, 7);
  {
    auto blocks = WriteBlocks::create(6, kBlock, 4096);
    ASSERT_TRUE(blocks) << blocks.error();
    auto queue = WriteQueue::create(**file, 4, **blocks);
    ASSERT_TRUE(queue) << queue.error();
    // The first block first (the ones a reservation faulted in).
    auto first = (*queue)->acquire();
    ASSERT_TRUE(first);
    EXPECT_EQ(*first, (*blocks)->blocks()[0]);
    (*queue)->release(*first);
    // Submitted back to front: the offsets, not the order, place them.
    for (uint64_t block = 40; block-- > 0;) {
      auto free = (*queue)->acquire();
      ASSERT_TRUE(free) << free.error();
      std::memcpy(*free, expected.data() + block * kBlock, kBlock);
      (*queue)->submit(*free, block * kBlock, kBlock, "block " + std::to_string(block));
    }
    // A block taken and given back unwritten is fine.
    auto spare = (*queue)->acquire();
    ASSERT_TRUE(spare);
    (*queue)->release(*spare);
    ASSERT_TRUE((*queue)->drain());
  }
  ASSERT_TRUE((*file)->close());
  EXPECT_EQ(slurp(dir + "/data"), expected);
  (void)storage->removeTree(dir);
}

TEST(WriteQueue, AFailedWriteStopsTheQueueAndNamesTheItem) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  Fault fault;
  fault.op = Fault::Op::Write;
  fault.nth = 3;
  auto storage = createFaultInjectingStorage(createPosixStorage(), fault);
  auto file = storage->createDirect(dir + "/data");
  ASSERT_TRUE(file) << file.error();
  // One I/O thread: the third write is block 2, whatever the timing.
  auto blocks = WriteBlocks::create(3, kBlock, 4096);
  ASSERT_TRUE(blocks) << blocks.error();
  auto queue = WriteQueue::create(**file, 1, **blocks);
  ASSERT_TRUE(queue) << queue.error();
  std::string bytes = pattern(kBlock, 1);
  bool acquireFailed = false;
  for (uint64_t block = 0; block < 50 && !acquireFailed; ++block) {
    auto free = (*queue)->acquire();
    if (!free) {
      // Once a write has failed, no more blocks are handed out.
      EXPECT_NE(free.error().find("(injected)"), std::string::npos) << free.error();
      acquireFailed = true;
      break;
    }
    std::memcpy(*free, bytes.data(), kBlock);
    (*queue)->submit(*free, block * kBlock, kBlock, "item " + std::to_string(block));
  }
  Status drained = (*queue)->drain();
  ASSERT_FALSE(drained);
  EXPECT_NE(drained.error().find("write at 131072 failed (injected)"), std::string::npos)
      << drained.error();
  EXPECT_NE(drained.error().find("(item item 2)"), std::string::npos) << drained.error();
  EXPECT_TRUE(acquireFailed);
  queue->reset(); // joins its threads with writes still queued: none run after
  (void)storage->removeTree(dir);
}

TEST(WriteBlocks, ASaveReusesTheKeptBlocksAndMakesMoreWhenItNeedsMore) {
  std::unique_ptr<WriteBlocks> kept;
  // 1 worker, 8 writes in flight (the default depth): 9 blocks.
  auto first = WriteBlocks::forSave(kept, 1, 0);
  ASSERT_TRUE(first) << first.error();
  ASSERT_EQ(*first, kept.get());
  ASSERT_EQ(kept->blocks().size(), 9u);
  EXPECT_EQ(kept->blockBytes(), kWriteBlockBytes);
  for (char *block : kept->blocks())
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % kWriteBlockAlignment, 0u);
  // touch faults the first blocks in (a queue hands those out first), no more than there are.
  kept->touch(2);
  kept->touch(100);
  for (char *block : {kept->blocks()[0], kept->blocks()[1]}) {
    std::vector<unsigned char> resident(kWriteBlockBytes / 4096);
    ASSERT_EQ(::mincore(block, kWriteBlockBytes, resident.data()), 0);
    for (unsigned char page : resident)
      ASSERT_TRUE(page & 1);
  }
  std::vector<char *> made = kept->blocks();
  // A save that needs as many or fewer uses them as they are.
  auto again = WriteBlocks::forSave(kept, 1, 0);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *first);
  auto fewer = WriteBlocks::forSave(kept, 2, 4);
  ASSERT_TRUE(fewer);
  EXPECT_EQ(*fewer, *first);
  EXPECT_EQ(kept->blocks(), made);
  // One that needs more replaces them with a set of its size.
  auto more = WriteBlocks::forSave(kept, 4, 8);
  ASSERT_TRUE(more) << more.error();
  EXPECT_EQ(*more, kept.get());
  EXPECT_EQ(kept->blocks().size(), 12u);
}

TEST(WriteBlocks, ANoneOrUnalignedSizeIsRefused) {
  auto none = WriteBlocks::create(0, kBlock, 4096);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().find("write blocks"), std::string::npos) << none.error();
  auto unaligned = WriteBlocks::create(2, kBlock + 512, 4096);
  ASSERT_FALSE(unaligned);
  EXPECT_NE(unaligned.error().find("aligned block size"), std::string::npos)
      << unaligned.error();
}

/// A file of `size` bytes, written and evicted from the page cache.
std::string coldFile(const std::string &dir, const std::string &bytes) {
  std::string path = dir + "/cold";
  std::ofstream(path, std::ios::binary) << bytes;
  int fd = ::open(path.c_str(), O_RDONLY);
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return path;
}

Status acceptAll(uint64_t, const char *, size_t) { return Status::success(); }

TEST(DirectReads, AColdRangeIsReadInOrderIntoTheDestination) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(40u << 20, 3);
  // An unaligned range across many blocks, its end before the file's.
  uint64_t offset = 12345, count = bytes.size() - offset - 20000;
  for (bool into : {true, false}) {
    auto source = FileSource::open(coldFile(dir, bytes));
    ASSERT_TRUE(source) << source.error();
    std::string destination(into ? count : 0, '\0'), seen;
    uint64_t next = 0;
    Status read = (*source)->readBlocks(
        offset, count, into ? destination.data() : nullptr,
        [&](uint64_t at, const char *block, size_t size) {
          EXPECT_EQ(at, next); // in order, none skipped
          if (into)
            EXPECT_EQ(block, destination.data() + at); // hashed where it lands
          seen.append(block, size);
          next = at + size;
          return Status::success();
        });
    ASSERT_TRUE(read) << read.error();
    EXPECT_EQ(next, count);
    EXPECT_TRUE(seen == bytes.substr(offset, count));
    if (into)
      EXPECT_TRUE(destination == bytes.substr(offset, count));
    if ((*source)->directBytes() == 0)
      GTEST_SKIP() << "this file system reads through the cache (no O_DIRECT or RWF_NOWAIT)";
    EXPECT_EQ((*source)->directBytes(), count);
  }
  (void)createPosixStorage()->removeTree(dir);
}

/// Page-aligned memory with `before` guard bytes ahead of the destination
/// and as many after it, all set to 0xA5: a read that lands whole pages in
/// place must not touch them.
struct GuardedDestination {
  static constexpr uint64_t kGuard = 3 * 4096;
  GuardedDestination(uint64_t inPage, uint64_t count)
      : size((kGuard + 4096 + count + kGuard + 4095) / 4096 * 4096), // aligned_alloc's rule
        memory(static_cast<char *>(std::aligned_alloc(4096, size))),
        into(memory + kGuard + inPage), count(count) {
    std::memset(memory, 0xA5, size);
  }
  ~GuardedDestination() { std::free(memory); }
  bool guardsIntact() const {
    for (const char *at = memory; at < into; ++at)
      if (static_cast<unsigned char>(*at) != 0xA5)
        return false;
    for (const char *at = into + count; at < memory + size; ++at)
      if (static_cast<unsigned char>(*at) != 0xA5)
        return false;
    return true;
  }
  uint64_t size;
  char *memory, *into;
  uint64_t count;
};

/// The bytes of the whole 4 KiB pages of the file within [offset, offset + count).
uint64_t wholePagesOf(uint64_t offset, uint64_t count) {
  return (offset + count) / 4096 * 4096 - (offset + 4095) / 4096 * 4096;
}

TEST(DirectReads, WhereTheDestinationSitsInItsPageAsTheRangeDoesWholePagesLandInPlace) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(40u << 20, 21);
  // Unaligned at both ends: the partial first and last pages are staged,
  // the whole pages between land in the destination itself.
  uint64_t offset = 5 * 4096 + 704, count = bytes.size() - offset - 3000;
  uint64_t wholePages = wholePagesOf(offset, count);
  for (uint64_t inPage : {offset % 4096, uint64_t(64)}) {
    bool matches = inPage == offset % 4096;
    auto source = FileSource::open(coldFile(dir, bytes));
    ASSERT_TRUE(source) << source.error();
    GuardedDestination destination(inPage, count);
    uint64_t next = 0;
    Status read = (*source)->readBlocks(offset, count, destination.into,
                                        [&](uint64_t at, const char *block, size_t size) {
                                          EXPECT_EQ(at, next);
                                          EXPECT_EQ(block, destination.into + at);
                                          next = at + size;
                                          return Status::success();
                                        });
    ASSERT_TRUE(read) << read.error();
    EXPECT_EQ(next, count);
    EXPECT_TRUE(std::memcmp(destination.into, bytes.data() + offset, count) == 0);
    EXPECT_TRUE(destination.guardsIntact()) << "in page at " << inPage;
    if ((*source)->directBytes() == 0)
      GTEST_SKIP() << "this file system reads through the cache (no O_DIRECT)";
    EXPECT_EQ((*source)->directBytes(), count);
    // Elsewhere in its page: every byte staged and copied, as before.
    EXPECT_EQ((*source)->inPlaceBytes(), matches ? wholePages : 0u) << "in page at " << inPage;
  }
  (void)createPosixStorage()->removeTree(dir);
}

TEST(DirectReads, RangesFromOneMiBGoDirectWhenTheyLandInPlace) {
  // Staged direct reads start at 16 MiB (each thread's staging is faulted in
  // at its first); ranges read in place need none, and go direct from 1 MiB.
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(8u << 20, 25);
  uint64_t offset = 4096 + 192;
  for (uint64_t count : {uint64_t(3) << 20, uint64_t(1) << 20, uint64_t(1000) << 10}) {
    for (bool matches : {true, false}) {
      auto source = FileSource::open(coldFile(dir, bytes));
      ASSERT_TRUE(source) << source.error();
      GuardedDestination destination(matches ? offset % 4096 : 0, count);
      ASSERT_TRUE((*source)->readBlocks(offset, count, destination.into, acceptAll));
      EXPECT_TRUE(std::memcmp(destination.into, bytes.data() + offset, count) == 0);
      EXPECT_TRUE(destination.guardsIntact());
      bool direct = matches && count >= (uint64_t(1) << 20);
      if (direct && (*source)->directBytes() == 0)
        GTEST_SKIP() << "this file system reads through the cache (no O_DIRECT)";
      EXPECT_EQ((*source)->directBytes(), direct ? count : 0u) << count << " " << matches;
      EXPECT_EQ((*source)->inPlaceBytes() > 0, direct) << count << " " << matches;
    }
  }
  (void)createPosixStorage()->removeTree(dir);
}

TEST(DirectReads, AFileThatShrinksUnderAnInPlaceReadIsAnErrorAndNothingLandsOutside) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(40u << 20, 23);
  uint64_t offset = 4096 + 128, count = bytes.size() - offset;
  auto source = FileSource::open(coldFile(dir, bytes));
  ASSERT_TRUE(source) << source.error();
  ASSERT_EQ(::truncate((dir + "/cold").c_str(), (20 << 20) + 100), 0);
  GuardedDestination destination(offset % 4096, count);
  Status read = (*source)->readBlocks(offset, count, destination.into, acceptAll);
  ASSERT_FALSE(read);
  EXPECT_EQ(read.kind(), ErrorKind::Corrupt);
  EXPECT_NE(read.error().find("shrank"), std::string::npos) << read.error();
  EXPECT_TRUE(destination.guardsIntact());
  (void)createPosixStorage()->removeTree(dir);
}

TEST(DirectReads, TurnedOffAColdRangeIsReadThroughTheCache) {
  // The same cold range, read direct by default and through the cache when
  // direct reads are off (LoadOptions::directReads): the same bytes, and
  // then they are cached.
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(24u << 20, 9);
  uint64_t offset = 4097, count = bytes.size() - offset;
  for (bool direct : {true, false}) {
    auto source = FileSource::open(coldFile(dir, bytes));
    ASSERT_TRUE(source) << source.error();
    if ((*source)->missingShare(offset, count) < 0.9)
      GTEST_SKIP() << "this file system keeps evicted files in its cache";
    (*source)->allowDirectReads(direct);
    std::string destination(count, '\0');
    ASSERT_TRUE((*source)->readBlocks(offset, count, destination.data(), acceptAll));
    EXPECT_TRUE(destination == bytes.substr(offset, count)) << (direct ? "direct" : "buffered");
    if (direct && (*source)->directBytes() == 0)
      GTEST_SKIP() << "this file system reads through the cache (no O_DIRECT)";
    EXPECT_EQ((*source)->directBytes(), direct ? count : 0u);
    double missing = (*source)->missingShare(offset, count);
    if (direct)
      EXPECT_GT(missing, 0.9); // direct reads leave the cache as it was
    else
      EXPECT_LT(missing, 0.1);
  }
  (void)createPosixStorage()->removeTree(dir);
}

TEST(DirectReads, AWarmRangeIsReadThroughTheCache) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(20u << 20, 5);
  std::string path = dir + "/warm";
  std::ofstream(path, std::ios::binary) << bytes;
  auto source = FileSource::open(path);
  ASSERT_TRUE(source) << source.error();
  std::string seen;
  ASSERT_TRUE((*source)->readBlocks(0, bytes.size(), nullptr,
                                    [&](uint64_t, const char *block, size_t size) {
                                      seen.append(block, size);
                                      return Status::success();
                                    }));
  EXPECT_TRUE(seen == bytes);
  EXPECT_EQ((*source)->directBytes(), 0u);
  (void)createPosixStorage()->removeTree(dir);
}

/// Reads [offset, offset + count) of `path` through the page cache, and no
/// more (readahead off).
void readThroughCache(const std::string &path, uint64_t offset, uint64_t count) {
  std::string bytes(count, '\0');
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM), 0);
  ASSERT_EQ(::pread(fd, bytes.data(), count, static_cast<off_t>(offset)),
            static_cast<ssize_t>(count));
  ::close(fd);
}

TEST(DirectReads, TheColdProbeCountsCachedPagesAndReadsNothing) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(32u << 20, 9);
  std::string path = coldFile(dir, bytes);
  auto source = FileSource::open(path);
  ASSERT_TRUE(source) << source.error();
  if (!(*source)->cold(0, bytes.size()))
    GTEST_SKIP() << "this file system keeps evicted files in its cache";
  // Probing starts no read: a probing read (RWF_NOWAIT) starts readahead of
  // the pages it probes, and the next probe would find them cached.
  for (int probe = 0; probe < 3; ++probe)
    EXPECT_TRUE((*source)->cold(0, bytes.size()));
  // A sixteenth cached: still cold. All but a thirty-second: warm.
  readThroughCache(path, 0, 2u << 20);
  EXPECT_TRUE((*source)->cold(0, bytes.size()));
  EXPECT_FALSE((*source)->cold(0, 2u << 20));
  readThroughCache(path, 0, bytes.size());
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::posix_fadvise(fd, 31 << 20, 1 << 20, POSIX_FADV_DONTNEED), 0);
  EXPECT_FALSE((*source)->cold(0, bytes.size()));
  EXPECT_TRUE((*source)->cold(31u << 20, 1u << 20));
  ASSERT_EQ(::posix_fadvise(fd, 24 << 20, 8 << 20, POSIX_FADV_DONTNEED), 0);
  EXPECT_TRUE((*source)->cold(0, bytes.size()));
  ::close(fd);
  // Past the end of a file that shrank nothing is missing.
  ASSERT_EQ(::truncate(path.c_str(), 16 << 20), 0);
  EXPECT_FALSE((*source)->cold(0, bytes.size()));
  EXPECT_FALSE((*source)->cold(20u << 20, 1u << 20));
  (void)createPosixStorage()->removeTree(dir);
}

TEST(DirectReads, APartlyCachedRangeIsReadThroughTheCache) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(32u << 20, 10);
  std::string path = coldFile(dir, bytes);
  auto source = FileSource::open(path);
  ASSERT_TRUE(source) << source.error();
  if (!(*source)->cold(0, bytes.size()))
    GTEST_SKIP() << "this file system keeps evicted files in its cache";
  // Half of it cached: direct reads would fetch twice what is missing. (The
  // bounds are the ones readBlocks goes by.)
  readThroughCache(path, 0, 16u << 20);
  double missing = (*source)->missingShare(0, bytes.size());
  EXPECT_GT(missing, 1.0 / 8);
  EXPECT_LE(missing, 3.0 / 4);
  std::string destination(bytes.size(), '\0');
  ASSERT_TRUE((*source)->readBlocks(0, bytes.size(), destination.data(), acceptAll));
  EXPECT_TRUE(destination == bytes);
  EXPECT_EQ((*source)->directBytes(), 0u);
  EXPECT_EQ((*source)->mappedBytes(), 0u);
  // All of it cached now: copied out of a mapping.
  ASSERT_TRUE((*source)->readBlocks(0, bytes.size(), destination.data(), acceptAll));
  EXPECT_EQ((*source)->mappedBytes(), bytes.size());
  (void)createPosixStorage()->removeTree(dir);
}

TEST(DirectReads, AFileThatShrinksIsAnErrorAndAConsumerErrorStops) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(40u << 20, 9);
  auto source = FileSource::open(coldFile(dir, bytes));
  ASSERT_TRUE(source) << source.error();
  ASSERT_EQ(::truncate((dir + "/cold").c_str(), 20 << 20), 0);
  Status read = (*source)->readBlocks(0, bytes.size(), nullptr,
                                      [](uint64_t, const char *, size_t) {
                                        return Status::success();
                                      });
  ASSERT_FALSE(read);
  EXPECT_NE(read.error().find("shrank"), std::string::npos) << read.error();

  auto again = FileSource::open(coldFile(dir, bytes));
  ASSERT_TRUE(again);
  uint64_t calls = 0;
  Status stopped = (*again)->readBlocks(0, bytes.size(), nullptr,
                                        [&](uint64_t, const char *, size_t) {
                                          return ++calls == 3 ? Status(makeError("enough"))
                                                              : Status::success();
                                        });
  ASSERT_FALSE(stopped);
  EXPECT_EQ(stopped.error(), "enough");
  EXPECT_EQ(calls, 3u);
  // Past the end: refused before any read.
  Status past = (*again)->readBlocks(bytes.size() - 10, 20, nullptr,
                                     [](uint64_t, const char *, size_t) {
                                       return Status::success();
                                     });
  ASSERT_FALSE(past);
  EXPECT_NE(past.error().find("past the end"), std::string::npos) << past.error();
  (void)createPosixStorage()->removeTree(dir);
}

/// A file of `bytes` under `dir`, left in the page cache.
std::string warmFile(const std::string &dir, const std::string &bytes) {
  std::string path = dir + "/warm";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}


/// A BlockCopy that copies and counts, and the bytes it has copied.
struct CountingCopy {
  uint64_t copied = 0;
  const char *lastEnd = nullptr; // where the last block copied ends in the destination
  zip::ByteSource::BlockCopy copy = [this](char *to, const char *from, size_t size) {
    std::memcpy(to, from, size);
    copied += size;
    lastEnd = to + size;
  };
};

TEST(MappedReads, AWarmRangeIsCopiedOutOfAMappingInOrder) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(20u << 20, 7);
  auto source = FileSource::open(warmFile(dir, bytes));
  ASSERT_TRUE(source) << source.error();
  // Unaligned at both ends, across many blocks.
  uint64_t offset = 4097 + 12345, count = bytes.size() - offset - 777;
  std::string destination(count, '\0');
  uint64_t next = 0;
  Status read = (*source)->readBlocks(offset, count, destination.data(),
                                      [&](uint64_t at, const char *block, size_t size) {
                                        EXPECT_EQ(at, next);
                                        // The file's bytes, landed before the
                                        // consumer hears of them.
                                        EXPECT_EQ(std::memcmp(block, &bytes[offset + at], size), 0);
                                        EXPECT_EQ(std::memcmp(&destination[at], block, size), 0);
                                        next = at + size;
                                        return Status::success();
                                      });
  ASSERT_TRUE(read) << read.error();
  EXPECT_EQ(next, count);
  EXPECT_TRUE(destination == bytes.substr(offset, count));
  EXPECT_EQ((*source)->mappedBytes(), count);
  EXPECT_EQ((*source)->directBytes(), 0u);
  // A consumer's error stops the read there.
  uint64_t calls = 0;
  Status stopped = (*source)->readBlocks(0, bytes.size(), destination.data(),
                                         [&](uint64_t, const char *, size_t) {
                                           return ++calls == 3 ? Status(makeError("enough"))
                                                               : Status::success();
                                         });
  ASSERT_FALSE(stopped);
  EXPECT_EQ(stopped.error(), "enough");
  EXPECT_EQ(calls, 3u);
  (void)createPosixStorage()->removeTree(dir);
}

TEST(MappedReads, AFileThatShrinksAfterItWasOpenedIsAnErrorNotACrash) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(40u << 20, 11);
  std::string path = warmFile(dir, bytes);
  auto source = FileSource::open(path);
  ASSERT_TRUE(source) << source.error();
  // What a save by another program into the same directory does.
  ASSERT_EQ(::truncate(path.c_str(), 20 << 20), 0);
  std::string destination(bytes.size(), '\0');
  Status read = (*source)->readBlocks(0, bytes.size(), destination.data(), acceptAll);
  ASSERT_FALSE(read);
  EXPECT_EQ(read.kind(), ErrorKind::Corrupt);
  EXPECT_NE(read.error().find("at 20971520 (the file shrank while being read)"),
            std::string::npos)
      << read.error();
  EXPECT_GT((*source)->mappedBytes(), 0u);
  EXPECT_TRUE(destination.compare(0, 20 << 20, bytes, 0, 20 << 20) == 0);
  // The guard is left as it was: the part still there reads again, and the
  // part gone fails again (SIGBUS is not left blocked, which would end the
  // process at the next fault).
  ASSERT_TRUE((*source)->readBlocks(0, 10 << 20, destination.data(), acceptAll));
  Status again = (*source)->readBlocks(0, bytes.size(), destination.data(), acceptAll);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().find("the file shrank"), std::string::npos) << again.error();
  // So does a read through a caller's copy (a load casting as it copies),
  // which copied the blocks before the end and not the one cut.
  CountingCopy copy;
  Status copied =
      (*source)->readBlocks(0, bytes.size(), destination.data(), acceptAll, &copy.copy);
  ASSERT_FALSE(copied);
  EXPECT_NE(copied.error().find("at 20971520 (the file shrank"), std::string::npos)
      << copied.error();
  EXPECT_EQ(copy.copied, uint64_t(20) << 20);
  // The consumer reads each block from the mapping (a load hashes it there,
  // after its copy): a page gone under the consumer alone, which a copy
  // that does not read the source never touched, is the same error.
  zip::ByteSource::BlockCopy blind = [](char *to, const char *, size_t size) {
    std::memset(to, 0, size);
  };
  uint64_t summed = 0, sum = 0;
  Status hashed = (*source)->readBlocks(
      0, bytes.size(), destination.data(),
      [&](uint64_t, const char *block, size_t size) {
        for (size_t at = 0; at < size; ++at)
          sum += static_cast<unsigned char>(block[at]);
        summed += size;
        return Status::success();
      },
      &blind);
  ASSERT_FALSE(hashed);
  EXPECT_NE(hashed.error().find("at 20971520 (the file shrank"), std::string::npos)
      << hashed.error();
  EXPECT_EQ(summed, uint64_t(20) << 20);
  EXPECT_NE(sum, 0u);
  (void)createPosixStorage()->removeTree(dir);
}

TEST(BlockCopies, EveryBlockCopiedIntoTheDestinationGoesThroughTheCallersCopy) {
  // A load casts main weights as it copies them: each block a read copies
  // (out of a mapping, or out of staging) is copied by the caller's copy,
  // before the consumer hears of it; blocks read straight into the
  // destination (in place, or by pread) are not.
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(40u << 20, 31);
  uint64_t offset = 5 * 4096 + 704, count = bytes.size() - offset - 3000;
  uint64_t wholePages = wholePagesOf(offset, count);
  struct Case {
    const char *name;
    bool warm;
    uint64_t inPage; // where the destination starts in its page
    uint64_t count;
  };
  for (const Case &run : {Case{"warm: mapped", true, 64, count},
                          Case{"cold: staged", false, 64, count},
                          Case{"cold: in place", false, offset % 4096, count},
                          Case{"under 1 MiB: pread", true, 64, uint64_t(1000) << 10}}) {
    SCOPED_TRACE(run.name);
    auto source = FileSource::open(run.warm ? warmFile(dir, bytes) : coldFile(dir, bytes));
    ASSERT_TRUE(source) << source.error();
    GuardedDestination destination(run.inPage, run.count);
    CountingCopy copy;
    uint64_t next = 0, heardCopied = 0;
    Status read = (*source)->readBlocks(
        offset, run.count, destination.into,
        [&](uint64_t at, const char *block, size_t size) {
          // The block's bytes: where they landed, or the source's they were
          // copied from (a mapped read hashes those, still in cache).
          EXPECT_EQ(std::memcmp(block, bytes.data() + offset + at, size), 0);
          EXPECT_EQ(std::memcmp(destination.into + at, block, size), 0);
          // A copied block has been copied whole when the consumer hears of it.
          if (copy.lastEnd == destination.into + at + size)
            heardCopied += size;
          next = at + size;
          return Status::success();
        },
        &copy.copy);
    ASSERT_TRUE(read) << read.error();
    EXPECT_EQ(next, run.count);
    EXPECT_TRUE(std::memcmp(destination.into, bytes.data() + offset, run.count) == 0);
    EXPECT_TRUE(destination.guardsIntact());
    EXPECT_EQ(heardCopied, copy.copied);
    uint64_t readStraightIn = (*source)->inPlaceBytes();
    if (run.count < (1u << 20)) {
      EXPECT_EQ(copy.copied, 0u);
    } else if (run.warm) {
      EXPECT_EQ((*source)->mappedBytes(), run.count);
      EXPECT_EQ(copy.copied, run.count);
    } else {
      if ((*source)->directBytes() == 0)
        GTEST_SKIP() << "this file system reads through the cache (no O_DIRECT)";
      EXPECT_EQ(readStraightIn, run.inPage == offset % 4096 ? wholePages : 0u);
      EXPECT_EQ(copy.copied, run.count - readStraightIn);
    }
  }
  (void)createPosixStorage()->removeTree(dir);
}

void callersBusHandler(int) { std::_Exit(99); }

TEST(MappedReads, ACallersOwnBusHandlerIsLeftAloneAndPreadReads) {
  std::string dir = tempDir();
  ASSERT_FALSE(dir.empty());
  std::string bytes = pattern(20u << 20, 13);
  std::string path = warmFile(dir, bytes);
  {
    // The guard's handler goes in with a first mapped read.
    auto source = FileSource::open(path);
    ASSERT_TRUE(source);
    std::string destination(bytes.size(), '\0');
    ASSERT_TRUE((*source)->readBlocks(0, bytes.size(), destination.data(), acceptAll));
    ASSERT_EQ((*source)->mappedBytes(), bytes.size());
  }
  struct sigaction callers {}, before {};
  callers.sa_handler = callersBusHandler;
  sigemptyset(&callers.sa_mask);
  ASSERT_EQ(::sigaction(SIGBUS, &callers, &before), 0);
  auto source = FileSource::open(path);
  ASSERT_TRUE(source);
  std::string destination(bytes.size(), '\0');
  ASSERT_TRUE((*source)->readBlocks(0, bytes.size(), destination.data(), acceptAll));
  EXPECT_TRUE(destination == bytes);
  EXPECT_EQ((*source)->mappedBytes(), 0u); // read by pread
  ASSERT_EQ(::truncate(path.c_str(), 10 << 20), 0);
  Status read = (*source)->readBlocks(0, bytes.size(), destination.data(), acceptAll);
  ASSERT_FALSE(read);
  EXPECT_NE(read.error().find("shrank"), std::string::npos) << read.error();
  struct sigaction now {};
  ASSERT_EQ(::sigaction(SIGBUS, &before, &now), 0);
  EXPECT_EQ(now.sa_handler, callersBusHandler); // never replaced
  (void)createPosixStorage()->removeTree(dir);
}

} // namespace
