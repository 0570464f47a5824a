//===- ReaderTest.cpp - Hostile-file defences of the checkpoint reader ----===//
//
// What the reader's defences rest on, one by one: escaping of bytes from
// files, error kinds kept across layers, plain file names, files
// opened only when regular and inside their directory, the save claim, and
// staging directories refused whatever their name. (Whole hostile
// checkpoints: test/Tools/fsdp-ckpt/hostile.test.)
//
//===----------------------------------------------------------------------===//

#include "../TestModels.h"
#include "ForwardingStorage.h"
#include "MultiRank.h"
#include "fsdp/Runtime/Checkpoint.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/Storage.h"
#include "fsdp/Support/Printable.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

using namespace fsdp;
using namespace fsdp::runtime;

namespace {

/// A fresh directory under TMPDIR, removed at the end.
class TempDir {
public:
  TempDir() {
    const char *base = std::getenv("TMPDIR");
    std::string pattern = std::string(base ? base : "/tmp") + "/fsdp-reader-XXXXXX";
    path_ = ::mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    if (!path_.empty())
      (void)createPosixStorage()->removeTree(path_);
  }
  const std::string &path() const { return path_; }
  std::string write(const std::string &name, const std::string &bytes) const {
    std::ofstream(path_ + "/" + name, std::ios::binary) << bytes;
    return path_ + "/" + name;
  }

private:
  std::string path_;
};

TEST(Printable, KeepsTextAndEscapesControls) {
  EXPECT_EQ(printable("model.layers.0.weight"), "model.layers.0.weight");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");
  EXPECT_EQ(printable("a\x1b[31mred\nnext\tx\r\x07"), "a\\x1b[31mred\\nnext\\tx\\r\\x07");
  EXPECT_EQ(printable(std::string("nul\0end", 7)), "nul\\x00end");
  EXPECT_EQ(printable("del\x7f"), "del\\x7f");
  // C1 controls encoded in UTF-8 (U+009B is CSI), a raw C1 byte, overlong
  // and truncated sequences, surrogates: every byte escaped.
  EXPECT_EQ(printable("\xc2\x9b"
                      "2J"),
            "\\xc2\\x9b2J");
  EXPECT_EQ(printable("\x9b"), "\\x9b");
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(printable("\xe6\x97"), "\\xe6\\x97");
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  // Idempotent on its own output: escaping twice changes nothing.
  std::string once = printable("\x1b]0;title\x07");
  EXPECT_EQ(printable(once), once);
}

TEST(ErrorKinds, KeptAcrossLayers) {
  Status io = makeError("x: write failed: Input/output error", ErrorKind::IO, 5);
  Error wrapped = propagate(io, "save failed: " + io.error());
  EXPECT_EQ(wrapped.kind, ErrorKind::IO);
  EXPECT_EQ(wrapped.errnum, 5);
  EXPECT_EQ(wrapped.message, "save failed: x: write failed: Input/output error");
  // classify gives a kind only to errors no layer classified.
  EXPECT_EQ(classify(Status(makeError("parse")), "m", ErrorKind::Corrupt).kind, ErrorKind::Corrupt);
  EXPECT_EQ(classify(Status(makeError("gone", ErrorKind::NotFound)), "m", ErrorKind::Corrupt).kind,
            ErrorKind::NotFound);
  // Across ranks: ProtocolTest.cpp.
  // Exit codes differ by kind.
  EXPECT_EQ(errorKindExitCode(ErrorKind::Internal), 1);
  EXPECT_EQ(errorKindExitCode(ErrorKind::InvalidArgument), 2);
  EXPECT_EQ(errorKindExitCode(ErrorKind::NotFound), 3);
  EXPECT_EQ(errorKindExitCode(ErrorKind::Corrupt), 4);
  EXPECT_EQ(errorKindExitCode(ErrorKind::Incompatible), 5);
  EXPECT_EQ(errorKindExitCode(ErrorKind::IO), 6);
  EXPECT_EQ(errorKindExitCode(ErrorKind::Busy), 7);
}

TEST(PlainFileName, OnlyNamesInsideTheDirectory) {
  EXPECT_TRUE(isPlainFileName("__0_0.distcp"));
  EXPECT_TRUE(isPlainFileName(".metadata"));
  EXPECT_FALSE(isPlainFileName(""));
  EXPECT_FALSE(isPlainFileName("."));
  EXPECT_FALSE(isPlainFileName(".."));
  EXPECT_FALSE(isPlainFileName("../x"));
  EXPECT_FALSE(isPlainFileName("/etc/passwd"));
  EXPECT_FALSE(isPlainFileName("sub/file"));
  EXPECT_FALSE(isPlainFileName(std::string("a\0b", 3)));
  EXPECT_FALSE(isPlainFileName(std::string(256, 'x')));
}

TEST(OpenRead, RegularFilesInsideTheirDirectoryOnly) {
  TempDir dir, outside;
  std::unique_ptr<Storage> storage = createPosixStorage();
  dir.write("file", "bytes");
  outside.write("secret", "secret");
  auto opened = storage->openRead(dir.path() + "/file");
  ASSERT_TRUE(opened) << opened.error();
  EXPECT_EQ((*opened)->size(), 5u);

  auto missing = storage->openRead(dir.path() + "/none");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.kind(), ErrorKind::NotFound);

  // A FIFO is refused at once (opening it would wait for a writer).
  ASSERT_EQ(::mkfifo((dir.path() + "/fifo").c_str(), 0600), 0);
  auto fifo = storage->openRead(dir.path() + "/fifo");
  ASSERT_FALSE(fifo);
  EXPECT_EQ(fifo.kind(), ErrorKind::Corrupt);
  EXPECT_NE(fifo.error().find("is a FIFO, not a regular file"), std::string::npos);

  ASSERT_EQ(::mkdir((dir.path() + "/subdir").c_str(), 0700), 0);
  auto directory = storage->openRead(dir.path() + "/subdir");
  ASSERT_FALSE(directory);
  EXPECT_NE(directory.error().find("is a directory"), std::string::npos);

  // A link to a file beside it is followed; a link out of the directory is not.
  ASSERT_EQ(::symlink("file", (dir.path() + "/inside").c_str()), 0);
  auto inside = storage->openRead(dir.path() + "/inside");
  ASSERT_TRUE(inside) << inside.error();
  EXPECT_EQ((*inside)->size(), 5u);
  ASSERT_EQ(::symlink((outside.path() + "/secret").c_str(), (dir.path() + "/out").c_str()), 0);
  auto out = storage->openRead(dir.path() + "/out");
  ASSERT_FALSE(out);
  EXPECT_EQ(out.kind(), ErrorKind::Corrupt);
  EXPECT_NE(out.error().find("symbolic link out of its directory"), std::string::npos);
}

TEST(Claim, SecondClaimIsBusyUntilTheFirstEnds) {
  TempDir dir;
  std::unique_ptr<Storage> storage = createPosixStorage();
  std::string lock = dir.path() + "/ckpt.fsdp-lock";
  {
    auto first = storage->claim(lock, "pid 1 on test");
    ASSERT_TRUE(first) << first.error();
    auto second = storage->claim(lock, "pid 2 on test");
    ASSERT_FALSE(second);
    EXPECT_EQ(second.kind(), ErrorKind::Busy);
    EXPECT_NE(second.error().find("busy: another save holds this target (pid 1 on test)"),
              std::string::npos)
        << second.error();
  }
  // Released: the lock file is gone and the target may be claimed again.
  EXPECT_FALSE(storage->exists(lock));
  auto again = storage->claim(lock, "pid 3 on test");
  EXPECT_TRUE(again) << again.error();
}

TEST(Reader, RefusesStagingDirectoriesHoweverNamed) {
  TempDir dir;
  std::unique_ptr<Storage> storage = createPosixStorage();
  std::string staging = dir.path() + "/ckpt.fsdp-staging";
  ASSERT_EQ(::mkdir(staging.c_str(), 0700), 0);
  for (const std::string &name : {staging, staging + "/", staging + "/.", staging + "//./"}) {
    auto reader = CheckpointReader::open(name, *storage);
    ASSERT_FALSE(reader) << name;
    EXPECT_EQ(reader.kind(), ErrorKind::NotFound);
    EXPECT_NE(reader.error().find("never committed"), std::string::npos) << reader.error();
  }
  // Renamed (or linked to), the marker a save leaves until it commits tells.
  std::string renamed = dir.path() + "/renamed";
  ASSERT_EQ(::mkdir(renamed.c_str(), 0700), 0);
  std::ofstream(renamed + "/" + kUncommittedMarker) << "";
  auto reader = CheckpointReader::open(renamed, *storage);
  ASSERT_FALSE(reader);
  EXPECT_EQ(reader.kind(), ErrorKind::NotFound);
  ASSERT_EQ(::symlink(staging.c_str(), (dir.path() + "/link").c_str()), 0);
  auto linked = CheckpointReader::open(dir.path() + "/link", *storage);
  ASSERT_FALSE(linked);
  EXPECT_NE(linked.error().find("never committed"), std::string::npos) << linked.error();
}

TEST(Reader, MissingCheckpointIsNotFound) {
  TempDir dir;
  std::unique_ptr<Storage> storage = createPosixStorage();
  auto reader = CheckpointReader::open(dir.path() + "/nothing", *storage);
  ASSERT_FALSE(reader);
  EXPECT_EQ(reader.kind(), ErrorKind::NotFound);
  EXPECT_NE(reader.error().find(".metadata: cannot open"), std::string::npos) << reader.error();
}

TEST(Reader, TrailingBytesAfterTheMetadataPickleAreCorrupt) {
  TempDir dir;
  std::unique_ptr<Storage> storage = createPosixStorage();
  // A valid pickle (None) and then bytes PyTorch never writes.
  dir.write(".metadata", std::string("\x80\x02N.", 4) + "garbage");
  auto reader = CheckpointReader::open(dir.path(), *storage);
  ASSERT_FALSE(reader);
  EXPECT_EQ(reader.kind(), ErrorKind::Corrupt);
  EXPECT_NE(reader.error().find("7 bytes after the pickle's end at 4"), std::string::npos)
      << reader.error();
}

} // namespace

namespace {

/// Posix storage that, on the first open of a data file, exchanges the
/// checkpoint being read with another one: a save with --overwrite
/// committing in the middle of a read.
class SwappingStorage : public ForwardingStorage {
public:
  SwappingStorage(std::string dir, std::string other)
      : dir_(std::move(dir)), other_(std::move(other)) {}
  Result<std::unique_ptr<zip::ByteSource>> openRead(const std::string &path) override {
    if (!swapped_ && path.size() > 7 && path.compare(path.size() - 7, 7, ".distcp") == 0) {
      swapped_ = true;
      EXPECT_TRUE(base_->exchange(dir_, other_));
    }
    return base_->openRead(path);
  }
  bool swapped() const { return swapped_; }

private:
  std::string dir_, other_;
  bool swapped_ = false;
};

TEST(ReplacedWhileReading, IsSaidAsSuchNotCorrupt) {
  using namespace fsdp::multirank;
  std::string work = tempDir();
  ASSERT_FALSE(work.empty());
  plan::PlanFile plan = planFor(testmodels::workedExample({1}));
  expectAllOk(saveOnRanks(plan, work + "/ckpt", 1));
  expectAllOk(saveOnRanks(plan, work + "/newer", 2));
  // Untouched, both verify.
  std::unique_ptr<Storage> posix = createPosixStorage();
  std::string report;
  EXPECT_TRUE(verifyCheckpoint(work + "/ckpt", *posix, report)) << report;

  SwappingStorage swapping(work + "/ckpt", work + "/newer");
  Status verified = verifyCheckpoint(work + "/ckpt", swapping, report);
  ASSERT_TRUE(swapping.swapped());
  ASSERT_FALSE(verified);
  EXPECT_EQ(verified.kind(), ErrorKind::Busy) << verified.error();
  EXPECT_NE(verified.error().find("replaced while it was being read"), std::string::npos)
      << verified.error();
  EXPECT_TRUE(report.empty()) << report;

  // A load the same way (the directories swapped back first).
  ASSERT_TRUE(posix->exchange(work + "/ckpt", work + "/newer"));
  onRanks(1, [&](int64_t, std::unique_ptr<Communicator> comm) {
    auto storage = std::make_unique<SwappingStorage>(work + "/ckpt", work + "/newer");
    SwappingStorage *seen = storage.get();
    Result<std::unique_ptr<Checkpointer>> opened =
        openAndAllocate(plan, std::move(comm), std::move(storage), {});
    ASSERT_TRUE(opened) << opened.error();
    Result<LoadResult> loaded = (*opened)->load(work + "/ckpt");
    ASSERT_TRUE(seen->swapped());
    ASSERT_FALSE(loaded);
    EXPECT_EQ(loaded.kind(), ErrorKind::Busy) << loaded.error();
    EXPECT_NE(loaded.error().find("replaced while it was being read"), std::string::npos)
        << loaded.error();
  });
  (void)posix->removeTree(work);
}

} // namespace
