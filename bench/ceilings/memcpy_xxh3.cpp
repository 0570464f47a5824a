//===- memcpy_xxh3.cpp - The warm load's limits: copy and checksum --------===//
//
// A warm load copies each item from the page cache into the buffers and
// checks its xxh3; nothing can do less. This program times that, block by
// block, each block hashed right after its copy, from its source (in cache
// after the copy, whichever way it copied):
//
//   fsdp-bench-memcpy-xxh3 [--block KIB] [--stream] BYTES THREADS
//     BYTES copied from one buffer of its own into another by THREADS
//     threads: memory to memory, by memcpy or, with --stream, with
//     streaming stores (which write to memory without reading each
//     destination line first; a load's copies out of the page cache).
//   fsdp-bench-memcpy-xxh3 [--block KIB] --pread FILE THREADS
//     FILE (in the page cache) read by pread into a buffer: the kernel's
//     copy out of the cache instead of memcpy (the copy is hashed).
//   fsdp-bench-memcpy-xxh3 [--block KIB] [--stream] --mmap FILE THREADS
//     FILE (in the page cache) mapped whole and copied out, as a load
//     copies a cached range: the faults that map the cache's pages count,
//     which a copy between buffers does not pay.
//   fsdp-bench-memcpy-xxh3 [--block KIB] [--stream] --cast ELEMENTS BYTES THREADS
//   fsdp-bench-memcpy-xxh3 [--block KIB] [--stream] --cast ELEMENTS --mmap FILE THREADS
//     as the first or the third, and the first ELEMENTS float32 also cast
//     to bfloat16 into a buffer of their own as they are copied, by the
//     runtime's own copying cast: the warm load's work with its
//     model-weight refresh, which casts each main-weight block as it
//     copies it.
//   fsdp-bench-memcpy-xxh3 [--block KIB] --stream --no-hash BYTES THREADS
//     the copy alone: an async save's capture, the stall's ceiling beside
//     one memcpy.
//
// Blocks are 1 MiB unless --block says otherwise; bench/checkpoint.py takes
// the fastest of several sizes (smaller blocks stay in a core's cache). Every
// buffer is in huge pages, as the runtime's are, and touched before the
// clock starts. Once they are, it prints
// "ready" and waits for a line (or the end) on stdin, so that
// bench/checkpoint.py, which runs one per rank, times them all at once, as
// the ranks of a load run (setting up one while another is timed would give
// the timed one more of the machine than a rank has). Then it prints the
// seconds.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Runtime/Cast.h"
#include "fsdp/Runtime/MemoryBackend.h"

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {
/// `bytes` of host memory as the runtime's buffers get it (huge pages, every
/// page touched), filled with `fill`; exits on failure.
std::shared_ptr<char> hostBytes(uint64_t bytes, int fill) {
  std::shared_ptr<fsdp::runtime::MemoryBackend> host = fsdp::runtime::createHostBackend();
  fsdp::Result<void *> memory = host->allocate(bytes);
  if (!memory) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: %s\n", memory.error().c_str());
    std::exit(2);
  }
  if (bytes)
    std::memset(*memory, fill, bytes);
  return std::shared_ptr<char>(static_cast<char *>(*memory),
                               [host](char *data) { host->release(data); });
}
} // namespace

int main(int argc, char **argv) {
  CLI::App app{"The warm load's ceiling: a copy and an xxh3 of every byte, block by block"};
  uint64_t blockKiB = 1024, castElements = 0;
  std::string file;
  std::vector<uint64_t> numbers;
  app.add_option("--block", blockKiB, "KiB copied and hashed at a time")
      ->check(CLI::Range(uint64_t(4), uint64_t(1) << 20));
  std::string mapped;
  auto *pread = app.add_option("--pread", file, "Read this cached file instead of a buffer");
  auto *map = app.add_option("--mmap", mapped, "Copy out of a mapping of this cached file")
                  ->excludes(pread);
  auto *cast_ = app.add_option("--cast", castElements, "Float32 elements also cast to bfloat16")
                   ->excludes(pread);
  bool stream = false, noHash = false;
  app.add_flag("--stream", stream, "Copy with streaming stores")->excludes(pread);
  app.add_flag("--no-hash", noHash, "Copy without hashing")->excludes(pread)->excludes(cast_);
  app.add_option("numbers", numbers, "BYTES THREADS, or THREADS alone with a file")->required();
  CLI11_PARSE(app, argc, argv);
  bool viaMapping = !mapped.empty();
  if (viaMapping)
    file = mapped;
  bool fromFile = !file.empty();
  if (numbers.size() != (fromFile ? 1u : 2u)) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: expected %s\n",
                 fromFile ? "THREADS after the FILE" : "BYTES THREADS");
    return 2;
  }
  int fd = -1;
  uint64_t bytes = fromFile ? 0 : numbers[0];
  if (fromFile) {
    fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat info;
    if (fd < 0 || ::fstat(fd, &info) != 0) {
      std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: cannot open %s\n", file.c_str());
      return 2;
    }
    bytes = static_cast<uint64_t>(info.st_size);
  }
  // The whole file mapped once, as a load maps each file: the page faults
  // that map the cache's pages fall within the timed copies.
  const char *mapping = nullptr;
  if (viaMapping && bytes) {
    void *address = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (address == MAP_FAILED) {
      std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: cannot map %s\n", file.c_str());
      return 2;
    }
    mapping = static_cast<const char *>(address);
  }
  uint64_t threads = numbers.back();
  if (!bytes || !threads || threads > 1024) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: BYTES and THREADS must be positive\n");
    return 2;
  }
  if (castElements > bytes / 4) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: ELEMENTS must fit in BYTES\n");
    return 2;
  }
  // KiB: whole float32 elements, so that a block's cast never cuts one.
  const uint64_t block = blockKiB << 10;
  // The runtime's own host memory (huge pages, MemoryBackend.cpp):
  // in small ones every copy would also pay the TLB misses a load does not.
  std::shared_ptr<char> source = hostBytes(fromFile ? 0 : bytes, 1),
                        destination = hostBytes(bytes, 2),
                        cast = hostBytes(castElements * sizeof(uint16_t), 3);
  std::atomic<uint64_t> next{0}, sink{0};
  std::atomic<bool> failed{false};
  std::printf("ready\n");
  std::fflush(stdout);
  (void)std::getchar(); // the start signal: a line, or the end of stdin
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (uint64_t t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      uint64_t digest = 0;
      for (uint64_t at; (at = next.fetch_add(block)) < bytes;) {
        uint64_t count = std::min(block, bytes - at);
        char *landed = destination.get() + at;
        // pread: the copy is hashed (the source is the kernel's).
        const char *from = mapping ? mapping + at : fromFile ? landed : source.get() + at;
        auto copy = [&](char *to, const char *start, uint64_t size) {
          if (stream)
            fsdp::runtime::copyBypassingCache(to, start, size);
          else
            std::memcpy(to, start, size);
        };
        if (fromFile && !mapping) {
          if (::pread(fd, landed, count, static_cast<off_t>(at)) != static_cast<ssize_t>(count))
            failed = true;
        } else {
          // The block's part among the first ELEMENTS is cast as it is copied.
          uint64_t castBytes =
              at / 4 < castElements ? std::min(count / 4, castElements - at / 4) * 4 : 0;
          if (castBytes &&
              !fsdp::runtime::copyAndCastElements(
                  fsdp::dcp::DType::Float32, from, landed, fsdp::dcp::DType::BFloat16,
                  reinterpret_cast<uint16_t *>(cast.get()) + at / 4, castBytes / 4))
            failed = true;
          copy(landed + castBytes, from + castBytes, count - castBytes);
        }
        if (!noHash)
          digest ^= fsdp::integrity::xxh3(from, count);
      }
      sink ^= digest;
    });
  for (std::thread &worker : workers)
    worker.join();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failed) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: %s\n",
                 fromFile ? ("short read of " + file).c_str() : "cast failed");
    return 1;
  }
  std::printf("%.6f\n", seconds);
  return sink.load() == 42 ? 3 : 0; // keeps the digests from being optimised away
}
