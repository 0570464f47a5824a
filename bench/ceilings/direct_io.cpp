//===- direct_io.cpp - The limits of a save and a cold load: direct I/O ----===//
//
// A cold load reads each range with O_DIRECT and kernel AIO into buffers in
// huge pages (so that a request reaches the disk whole, not cut at its
// segment limit), several ranges at a time; a save writes its file the same
// way from blocks in huge pages. This program does that I/O and nothing
// else, so that bench/checkpoint.py has ceilings of the same shape as ours,
// deeper or wider as asked:
//
//   fsdp-bench-direct-io [--streams S] [--depth D] [--block-mib B] FILE...
//     every FILE read at once, each by S threads (a contiguous slice each),
//     each thread keeping D reads of B MiB in flight (io_submit), into its
//     own buffers, 2 MiB-aligned, advised MADV_HUGEPAGE and touched before
//     the clock starts. Prints the seconds, then the bytes read.
//   fsdp-bench-direct-io --write --size N... [--reserve] [...] FILE...
//     every FILE created (replacing any) and written at once, N bytes each,
//     the same way, then fsynced; with --reserve its blocks are reserved
//     first (fallocate, the size kept), as a save reserves its file. The
//     clock runs from the first write to the last fsync.
//
// The file's tail past its last whole page is read too (a direct read must
// be whole pages; the last one comes back short); a written file's last page
// is written whole and the file then cut to its size. Any failed or short
// transfer before the end is an error, exit status 1.
//
//===----------------------------------------------------------------------===//
#include <CLI/CLI.hpp>

#include <linux/aio_abi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kHugePage = uint64_t(2) << 20;

struct Slice {
  int fd;
  uint64_t begin, end; // whole pages, end may pass the file's size
};

/// Reads (or writes) one slice with `depth` requests of `block` bytes in
/// flight. Returns an error message, or "" when every byte moved.
std::string transferSlice(const Slice &slice, bool write, unsigned depth, uint64_t block,
                          char *buffers, uint64_t fileSize, std::atomic<uint64_t> &bytes) {
  aio_context_t context = 0;
  if (::syscall(SYS_io_setup, depth, &context) != 0)
    return std::string("io_setup: ") + std::strerror(errno);
  std::vector<iocb> requests(depth);
  std::vector<iocb *> pointers(1);
  uint64_t next = slice.begin, pending = 0;
  std::string error;
  auto submit = [&](unsigned slot) {
    iocb &request = requests[slot];
    std::memset(&request, 0, sizeof(request));
    request.aio_data = slot;
    request.aio_lio_opcode = write ? IOCB_CMD_PWRITE : IOCB_CMD_PREAD;
    request.aio_fildes = static_cast<uint32_t>(slice.fd);
    request.aio_buf = reinterpret_cast<uint64_t>(buffers + slot * block);
    request.aio_offset = static_cast<int64_t>(next);
    request.aio_nbytes = std::min(block, slice.end - next);
    pointers[0] = &request;
    if (::syscall(SYS_io_submit, context, 1, pointers.data()) != 1)
      return false;
    next += request.aio_nbytes;
    ++pending;
    return true;
  };
  for (unsigned slot = 0; slot < depth && next < slice.end; ++slot)
    if (!submit(slot)) {
      error = std::string("io_submit: ") + std::strerror(errno);
      break;
    }
  std::vector<io_event> events(depth);
  while (pending && error.empty()) {
    long got = ::syscall(SYS_io_getevents, context, 1, depth, events.data(), nullptr);
    if (got < 0) {
      if (errno == EINTR)
        continue;
      error = std::string("io_getevents: ") + std::strerror(errno);
      break;
    }
    for (long e = 0; e < got; ++e) {
      --pending;
      const iocb &request = requests[events[e].data];
      int64_t result = events[e].res;
      uint64_t wanted = request.aio_nbytes;
      uint64_t at = static_cast<uint64_t>(request.aio_offset);
      // A read comes back short only at the file's end, where its last page is
      // partial; a write never does.
      bool shortBeforeTheEnd = write || at + result < fileSize;
      if (result < 0 || (static_cast<uint64_t>(result) < wanted && shortBeforeTheEnd)) {
        error = (write ? "write at " : "read at ") + std::to_string(at) + ": " +
                (result < 0 ? std::strerror(static_cast<int>(-result)) : "short");
        break;
      }
      bytes += std::min(static_cast<uint64_t>(result), fileSize - std::min(fileSize, at));
      if (next < slice.end && !submit(static_cast<unsigned>(events[e].data))) {
        error = std::string("io_submit: ") + std::strerror(errno);
        break;
      }
    }
  }
  // No read may land after the buffers go: wait for what is still in flight.
  while (pending) {
    long got = ::syscall(SYS_io_getevents, context, 1, depth, events.data(), nullptr);
    if (got > 0)
      pending -= static_cast<uint64_t>(got);
    else if (got < 0 && errno != EINTR)
      break;
  }
  ::syscall(SYS_io_destroy, context);
  return error;
}

} // namespace

int main(int argc, char **argv) {
  CLI::App app{"Reads or writes files with O_DIRECT and kernel AIO from huge-page buffers: the "
               "cold load's and the save's ceilings"};
  unsigned streams = 4, depth = 8;
  uint64_t blockMib = 8;
  bool write = false, reserve = false;
  std::vector<uint64_t> writeSizes;
  std::vector<std::string> paths;
  app.add_option("--streams", streams, "Threads per file, a contiguous slice each")
      ->check(CLI::Range(1u, 256u));
  app.add_option("--depth", depth, "Requests in flight per thread")->check(CLI::Range(1u, 256u));
  app.add_option("--block-mib", blockMib, "MiB per request")
      ->check(CLI::Range(uint64_t(1), uint64_t(256)));
  app.add_flag("--write", write, "Create and write the files (then fsync), not read them");
  app.add_option("--size", writeSizes, "With --write: bytes of each file, in order (one each)")
      ->allow_extra_args(false);
  app.add_flag("--reserve", reserve, "With --write: reserve each file's blocks first");
  app.add_option("files", paths, "Files to read or write")->required();
  CLI11_PARSE(app, argc, argv);
  if (write != (writeSizes.size() == paths.size()) || (reserve && !write)) {
    std::fprintf(stderr, "fsdp-bench-direct-io: --write needs one --size per file, and "
                         "--size and --reserve need --write\n");
    return 1;
  }

  const uint64_t block = blockMib << 20;
  std::vector<Slice> slices;
  std::vector<uint64_t> sizes;
  std::vector<int> fds;
  for (size_t f = 0; f < paths.size(); ++f) {
    const std::string &path = paths[f];
    int fd = write ? ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644)
                   : ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct stat info;
    if (fd < 0 || ::fstat(fd, &info) != 0) {
      std::fprintf(stderr, "fsdp-bench-direct-io: %s: %s\n", path.c_str(), std::strerror(errno));
      return 1;
    }
    fds.push_back(fd);
    uint64_t size = write ? writeSizes[f] : static_cast<uint64_t>(info.st_size);
    uint64_t pages = (size + kPage - 1) / kPage;
    // Slices of whole blocks where the file allows, so requests stay aligned to them.
    uint64_t perStream = (pages + streams - 1) / streams * kPage;
    perStream = std::max(block, (perStream + block - 1) / block * block);
    for (uint64_t begin = 0; begin < pages * kPage; begin += perStream) {
      slices.push_back({fd, begin, std::min(pages * kPage, begin + perStream)});
      sizes.push_back(size);
    }
  }
  // Each thread's buffers: 2 MiB-aligned, huge pages asked for, touched now.
  uint64_t perThread = (uint64_t(depth) * block + kHugePage - 1) / kHugePage * kHugePage;
  std::vector<char *> buffers;
  for (size_t i = 0; i < slices.size(); ++i) {
    void *memory = std::aligned_alloc(kHugePage, perThread);
    if (!memory) {
      std::fprintf(stderr, "fsdp-bench-direct-io: out of memory for %zu buffers of %llu bytes\n",
                   slices.size(), static_cast<unsigned long long>(perThread));
      return 1;
    }
    ::madvise(memory, perThread, MADV_HUGEPAGE);
    std::memset(memory, 1, perThread);
    buffers.push_back(static_cast<char *>(memory));
  }
  std::atomic<uint64_t> bytes{0};
  std::vector<std::string> errors(slices.size());
  auto start = std::chrono::steady_clock::now();
  // Reserved inside the clock, as a save reserves its file inside its own.
  for (size_t f = 0; reserve && f < fds.size(); ++f)
    if (::fallocate(fds[f], FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(writeSizes[f])) != 0) {
      std::fprintf(stderr, "fsdp-bench-direct-io: %s: fallocate: %s\n", paths[f].c_str(),
                   std::strerror(errno));
      return 1;
    }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < slices.size(); ++i)
    threads.emplace_back([&, i] {
      errors[i] = transferSlice(slices[i], write, depth, block, buffers[i], sizes[i], bytes);
    });
  for (std::thread &thread : threads)
    thread.join();
  // Each written file cut to its size (its last page went whole) and made durable.
  for (size_t f = 0; write && f < fds.size(); ++f)
    if (::ftruncate(fds[f], static_cast<off_t>(writeSizes[f])) != 0 || ::fsync(fds[f]) != 0) {
      std::fprintf(stderr, "fsdp-bench-direct-io: %s: %s\n", paths[f].c_str(),
                   std::strerror(errno));
      return 1;
    }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (char *buffer : buffers)
    std::free(buffer);
  for (int fd : fds)
    ::close(fd);
  for (size_t i = 0; i < errors.size(); ++i)
    if (!errors[i].empty()) {
      std::fprintf(stderr, "fsdp-bench-direct-io: slice %zu: %s\n", i, errors[i].c_str());
      return 1;
    }
  std::printf("%.6f\n%llu\n", seconds, static_cast<unsigned long long>(bytes.load()));
  return 0;
}
