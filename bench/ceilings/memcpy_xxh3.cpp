//===- memcpy_xxh3.cpp - The warm load's limit: copy and checksum ---------===//
//
// A warm load copies each item from the page cache into the buffers and
// checks its xxh3; nothing can do less. This program times exactly that on
// memory of its own: BYTES copied in 8 MiB blocks from one buffer into
// another by THREADS threads, each block hashed right after its copy (while
// it is in cache), both buffers touched before the clock starts. Prints the
// seconds; bench/checkpoint.py runs one per rank at once.
//
//   fsdp-bench-memcpy-xxh3 BYTES THREADS
//
//===----------------------------------------------------------------------===//
#include "fsdp/Format/IntegrityIndex.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fsdp-bench-memcpy-xxh3 BYTES THREADS\n");
    return 2;
  }
  uint64_t bytes = std::strtoull(argv[1], nullptr, 10);
  unsigned threads = static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10));
  if (!bytes || !threads || threads > 1024) {
    std::fprintf(stderr, "fsdp-bench-memcpy-xxh3: BYTES and THREADS must be positive\n");
    return 2;
  }
  constexpr uint64_t kBlock = uint64_t(8) << 20;
  std::vector<char> source(bytes, 1), destination(bytes, 2);
  std::atomic<uint64_t> next{0}, sink{0};
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&] {
      uint64_t digest = 0;
      for (uint64_t at; (at = next.fetch_add(kBlock)) < bytes;) {
        uint64_t count = std::min(kBlock, bytes - at);
        std::memcpy(destination.data() + at, source.data() + at, count);
        digest ^= fsdp::integrity::xxh3(destination.data() + at, count);
      }
      sink ^= digest;
    });
  for (std::thread &worker : workers)
    worker.join();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%.6f\n", seconds);
  return sink.load() == 42 ? 3 : 0; // keeps the digests from being optimised away
}
