//===- memcpy_xxh3.cpp - The warm load's limits: copy and checksum --------===//
//
// A warm load copies each item from the page cache into the buffers and
// checks its xxh3; nothing can do less. This program times that two ways:
//
//   fsdp-bench-memcpy-xxh3 BYTES THREADS
//     BYTES copied in 8 MiB blocks from one buffer of its own into another
//     by THREADS threads, each block hashed right after its copy (while it
//     is in cache), both buffers touched before the clock starts: the
//     bar, memory to memory.
//   fsdp-bench-memcpy-xxh3 --pread FILE THREADS
//     FILE (in the page cache) read by pread in 1 MiB blocks into a touched
//     buffer by THREADS threads, each block hashed after it lands: what the
//     kernel's copy out of the cache costs.
//   fsdp-bench-memcpy-xxh3 --cast ELEMENTS BYTES THREADS
//     as the first, then ELEMENTS float32 of the destination cast to
//     bfloat16 into a third touched buffer, in 4 Mi-element pieces the
//     threads share: the warm load's work with the model-weight refresh
//     (by the runtime's own cast, which runs at memory speed: an AVX-512
//     loop with non-temporal stores was 4% faster). Not a bar.
//
// Once its buffers are touched it prints "ready" and waits for a line (or
// the end) on stdin before the clock starts, so that bench/checkpoint.py,
// which runs one per rank, times them all at once, as the ranks of a load
// run (setting up one while another is timed would give the timed one more
// of the machine than a rank has). Then it prints the seconds.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Format/IntegrityIndex.h"
#include "fsdp/Runtime/Cast.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

int main(int argc, char **argv) {
  uint64_t castElements = 0;
  if (argc == 5 && std::string(argv[1]) == "--cast") {
    castElements = std::strtoull(argv[2], nullptr, 10);
    argv += 2;
    argc -= 2;
  }
  bool fromFile = argc == 4 && std::string(argv[1]) == "--pread" && !castElements;
  if (argc != 3 && !fromFile) {
    std::fprintf(stderr, "usage: fsdp-bench-memcpy-xxh3 BYTES THREADS\n"
                         "       fsdp-bench-memcpy-xxh3 --pread FILE THREADS\n"
                         "       fsdp-bench-memcpy-xxh3 --cast ELEMENTS BYTES THREADS\n");
    return 2;
  }
  int fd = -1;
  uint64_t bytes = 0;
  if (fromFile) {
    fd = ::open(argv[2], O_RDONLY | O_CLOEXEC);
    struct stat info;
    if (fd < 0 || ::fstat(fd, &info) != 0) {
      std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: cannot open %s\n", argv[2]);
      return 2;
    }
    bytes = static_cast<uint64_t>(info.st_size);
  } else {
    bytes = std::strtoull(argv[1], nullptr, 10);
  }
  unsigned threads = static_cast<unsigned>(std::strtoul(argv[argc - 1], nullptr, 10));
  if (!bytes || !threads || threads > 1024) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: BYTES and THREADS must be positive\n");
    return 2;
  }
  if (castElements > bytes / 4) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: ELEMENTS must fit in BYTES\n");
    return 2;
  }
  const uint64_t block = fromFile ? uint64_t(1) << 20 : uint64_t(8) << 20;
  std::vector<char> source(fromFile ? 0 : bytes, 1), destination(bytes, 2);
  std::vector<uint16_t> cast(castElements, 3);
  std::atomic<uint64_t> next{0}, nextCast{0}, sink{0};
  std::atomic<bool> failed{false};
  std::printf("ready\n");
  std::fflush(stdout);
  (void)std::getchar(); // the start signal: a line, or the end of stdin
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      uint64_t digest = 0;
      for (uint64_t at; (at = next.fetch_add(block)) < bytes;) {
        uint64_t count = std::min(block, bytes - at);
        if (fromFile) {
          if (::pread(fd, destination.data() + at, count, static_cast<off_t>(at)) !=
              static_cast<ssize_t>(count))
            failed = true;
        } else {
          std::memcpy(destination.data() + at, source.data() + at, count);
        }
        digest ^= fsdp::integrity::xxh3(destination.data() + at, count);
      }
      sink ^= digest;
    });
  for (std::thread &worker : workers)
    worker.join();
  workers.clear();
  const uint64_t piece = uint64_t(4) << 20;
  for (unsigned t = 0; t < threads && castElements; ++t)
    workers.emplace_back([&] {
      for (uint64_t at; (at = nextCast.fetch_add(piece)) < castElements;)
        if (!fsdp::runtime::castElements(fsdp::dcp::DType::Float32, destination.data() + 4 * at,
                                         fsdp::dcp::DType::BFloat16, cast.data() + at,
                                         std::min(piece, castElements - at)))
          failed = true;
    });
  for (std::thread &worker : workers)
    worker.join();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failed) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: %s\n",
                 fromFile ? ("short read of " + std::string(argv[2])).c_str() : "cast failed");
    return 1;
  }
  std::printf("%.6f\n", seconds);
  return sink.load() == 42 ? 3 : 0; // keeps the digests from being optimised away
}
