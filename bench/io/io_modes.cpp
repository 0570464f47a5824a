// io_modes: buffered pwrite/pread vs O_DIRECT vs io_uring, for fsdp-ckpt's checkpoint I/O shape.
//
// The save writes one large file per rank from a small writer pool, then fsyncs it; the load
// preads MB-sized ranges from several threads. This program times exactly those shapes for
// each I/O mode so that a switch away from buffered I/O is decided by numbers from the
// machine at hand, not by folklore. One JSON line per figure, then a human summary.
//
//   io_modes [--path P] [--size-mib N] [--blocks 1,8,32] [--threads 1,2] [--depths 8]
//            [--reps 3] [--ops write,read,memcpy,probe] [--modes buffered,odirect,...]
//            [--fallocate] [--thp]
//
// GB/s are decimal (1e9 bytes). Write times include open, the writes, fsync and close.
// Build: g++ -O2 -std=c++17 -pthread io_modes.cpp -luring
#include <liburing.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kHuge = 2 * kMiB;  // transparent huge page size on x86-64
constexpr uint64_t kPage = 4096;  // O_DIRECT alignment we use for memory, offsets and lengths
constexpr uint64_t kUserMisalign = 64;  // tensors from a CPU allocator: 64-byte aligned only
constexpr double kGB = 1e9;

// ---------------------------------------------------------------- options

struct Options {
  std::string path = "/tmp/fsdp-io-modes.bin";
  uint64_t size = 2048 * kMiB;
  std::vector<uint64_t> block_mib = {1, 8, 32};
  std::vector<int> threads = {1, 2};
  std::vector<unsigned> depths = {8};
  int reps = 3;
  std::set<std::string> ops = {"write", "read", "memcpy", "probe"};
  std::set<std::string> modes;  // empty: every mode
  bool fallocate_first = false;
  bool huge_pages = false;  // --thp: buffers on transparent huge pages
};

template <typename T> std::vector<T> parseList(const std::string &text) {
  std::vector<T> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ','))
    if (!item.empty())
      values.push_back(static_cast<T>(std::stoull(item)));
  return values;
}

std::set<std::string> parseNames(const std::string &text) {
  std::set<std::string> names;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ','))
    if (!item.empty())
      names.insert(item);
  return names;
}

[[noreturn]] void usage(const char *why) {
  std::fprintf(stderr,
               "io_modes: %s\nusage: io_modes [--path P] [--size-mib N] [--blocks 1,8,32] "
               "[--threads 1,2] [--depths 8] [--reps 3] [--ops write,read,memcpy,probe] "
               "[--modes buffered,odirect,odirect_bounce,uring,uring_odirect] [--fallocate] [--thp]\n",
               why);
  std::exit(2);
}

Options parseOptions(int argc, char **argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--path") options.path = value();
    else if (arg == "--size-mib") options.size = std::stoull(value()) * kMiB;
    else if (arg == "--blocks") options.block_mib = parseList<uint64_t>(value());
    else if (arg == "--threads") options.threads = parseList<int>(value());
    else if (arg == "--depths") options.depths = parseList<unsigned>(value());
    else if (arg == "--reps") options.reps = std::stoi(value());
    else if (arg == "--ops") options.ops = parseNames(value());
    else if (arg == "--modes") options.modes = parseNames(value());
    else if (arg == "--fallocate") options.fallocate_first = true;
    else if (arg == "--thp") options.huge_pages = true;
    else if (arg == "-h" || arg == "--help") usage("help");
    else usage(("unknown argument " + arg).c_str());
  }
  if (options.size == 0 || options.reps < 1 || options.block_mib.empty() ||
      options.threads.empty() || options.depths.empty())
    usage("sizes, reps, blocks, threads and depths must be positive");
  return options;
}

// ---------------------------------------------------------------- modes

struct Mode {
  const char *name;
  bool direct;  // open with O_DIRECT
  bool uring;   // submit through io_uring, `depth` requests in flight per thread
  bool bounce;  // user memory is only 64-byte aligned: copy through a 4 KiB-aligned buffer
};

// odirect_bounce is what integrating O_DIRECT would really cost when tensors are not
// page-aligned (or headers shift the payload): a memcpy per block plus the direct write.
const Mode kModes[] = {
    {"buffered", false, false, false},
    {"odirect", true, false, false},
    {"odirect_bounce", true, false, true},
    {"uring", false, true, false},
    {"uring_odirect", true, true, false},
};

// ---------------------------------------------------------------- helpers

struct Error : std::runtime_error {
  int code;
  Error(const std::string &what, int code_)
      : std::runtime_error(what + ": " + std::strerror(code_)), code(code_) {}
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double cpuSeconds() {  // user+sys of this process, io_uring's io-wq workers included
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto secs = [](const timeval &t) { return t.tv_sec + t.tv_usec / 1e6; };
  return secs(usage.ru_utime) + secs(usage.ru_stime);
}

uint64_t alignUp(uint64_t value, uint64_t to) { return (value + to - 1) / to * to; }

// Page-aligned anonymous memory, faulted in up front so page faults are never timed. With
// `huge`, 2 MiB-aligned and madvised for transparent huge pages: physically contiguous 2 MiB
// runs let one O_DIRECT request carry MBs even when the device caps segments per request.
struct Buffer {
  char *data = nullptr;
  uint64_t size = 0;
  void *map = nullptr;
  uint64_t map_size = 0;
  Buffer(uint64_t bytes, bool huge) : size(alignUp(bytes, kPage)) {
    map_size = size + (huge ? kHuge : 0);
    map = mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
      throw Error("mmap of " + std::to_string(map_size) + " bytes", errno);
    data = static_cast<char *>(map);
    if (huge) {
      data = reinterpret_cast<char *>(alignUp(reinterpret_cast<uint64_t>(map), kHuge));
      madvise(data, size, MADV_HUGEPAGE);
    }
    std::memset(data, 0, size);
  }
  ~Buffer() { munmap(map, map_size); }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;
};

// AnonHugePages of this process: whether --thp really got huge pages.
uint64_t anonHugeKiB() {
  FILE *file = std::fopen("/proc/self/smaps_rollup", "r");
  if (!file)
    return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof(line), file))
    if (std::sscanf(line, "AnonHugePages: %llu kB", &kib) == 1)
      break;
  std::fclose(file);
  return kib;
}

// Word i of the data is a hash of i: incompressible, and a read can be checked cheaply.
uint64_t patternWord(uint64_t index) { return (index + 1) * 0x9E3779B97F4A7C15ull ^ 0xC0FFEEull; }

void fillPattern(char *data, uint64_t size) {
  uint64_t *words = reinterpret_cast<uint64_t *>(data);
  for (uint64_t i = 0; i < size / 8; ++i)
    words[i] = patternWord(i);
}

// Checks one word per 4 KiB page: catches a missing or misplaced block, costs nothing.
bool checkPattern(const char *data, uint64_t size) {
  for (uint64_t offset = 0; offset + 8 <= size; offset += kPage) {
    uint64_t word;
    std::memcpy(&word, data + offset, 8);
    if (word != patternWord(offset / 8))
      return false;
  }
  return true;
}

std::string fsName(const std::string &path) {
  std::string dir = path.substr(0, path.find_last_of('/') + 1);
  struct statfs info{};
  if (statfs(dir.empty() ? "." : dir.c_str(), &info) != 0)
    return "unknown";
  switch (static_cast<unsigned long>(info.f_type)) {
  case 0xEF53: return "ext4";
  case 0x58465342: return "xfs";
  case 0x9123683E: return "btrfs";
  case 0x01021994: return "tmpfs";
  case 0x858458F6: return "ramfs";
  case 0x794C7630: return "overlayfs";
  case 0x6969: return "nfs";
  case 0x2FC12FC1: return "zfs";
  case 0x65735546: return "fuse";
  default: {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%lx", static_cast<unsigned long>(info.f_type));
    return hex;
  }
  }
}

void syncDirectoryOf(const std::string &path) {
  std::string dir = path.substr(0, path.find_last_of('/') + 1);
  int fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    syncfs(fd);  // flush what earlier passes left (and ext4's deferred discards) off the clock
    close(fd);
  }
}

// Fraction of the file's pages in the page cache (mincore on a mapping): tells whether
// posix_fadvise(DONTNEED) really evicted, instead of assuming it.
double residentFraction(const std::string &path, uint64_t size) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  void *map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED)
    return -1;
  uint64_t pages = (size + kPage - 1) / kPage;
  std::vector<unsigned char> resident(pages);
  double fraction = -1;
  if (mincore(map, size, resident.data()) == 0) {
    uint64_t count = 0;
    for (unsigned char page : resident)
      count += page & 1;
    fraction = static_cast<double>(count) / static_cast<double>(pages);
  }
  munmap(map, size);
  return fraction;
}

void evict(const std::string &path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error("open " + path, errno);
  fdatasync(fd);  // DONTNEED skips dirty pages; make them clean first
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// The block device's request counters (/sys/dev/block/M:N/stat) for the file's device: the
// average request size during a pass shows whether I/O reached the device in MB pieces or
// was chopped (readahead window, segments per request). Other processes' I/O mixes in.
struct DiskCounters {
  uint64_t read_ios = 0, read_sectors = 0, write_ios = 0, write_sectors = 0;
};

std::string g_disk_stat_path;  // set once in main

DiskCounters diskCounters() {
  DiskCounters counters;
  FILE *file = g_disk_stat_path.empty() ? nullptr : std::fopen(g_disk_stat_path.c_str(), "r");
  if (!file)
    return counters;
  unsigned long long f[7] = {};
  if (std::fscanf(file, "%llu %llu %llu %llu %llu %llu %llu", &f[0], &f[1], &f[2], &f[3], &f[4],
                  &f[5], &f[6]) == 7)
    counters = {f[0], f[2], f[4], f[6]};
  std::fclose(file);
  return counters;
}

double averageRequestKiB(uint64_t ios, uint64_t sectors) {
  return ios ? sectors * 512.0 / 1024.0 / static_cast<double>(ios) : -1;
}

// ---------------------------------------------------------------- one thread's I/O

struct Region {
  uint64_t begin, end;  // file offsets; the same offsets index the memory buffer
};

// Synchronous pwrite/pread loop over [begin, end) in `block` pieces (short counts retried).
void syncLoop(bool write, int fd, char *memory, const Region &region, uint64_t block,
              char *bounce, char *user) {
  for (uint64_t offset = region.begin; offset < region.end;) {
    uint64_t length = std::min(block, region.end - offset);
    char *io = bounce ? bounce : memory + offset;
    if (write && bounce)
      std::memcpy(bounce, user + offset, length);  // staging copy O_DIRECT would force on us
    uint64_t done = 0;
    while (done < length) {
      ssize_t got = write ? pwrite(fd, io + done, length - done, offset + done)
                          : pread(fd, io + done, length - done, offset + done);
      if (got < 0 && errno == EINTR)
        continue;
      if (got < 0)
        throw Error(write ? "pwrite" : "pread", errno);
      if (got == 0)
        throw Error(write ? "pwrite made no progress" : "pread hit end of file", EIO);
      done += static_cast<uint64_t>(got);
    }
    if (!write && bounce)
      std::memcpy(user + offset, bounce, length);
    offset += length;
  }
}

// io_uring loop: keeps up to `depth` block-sized requests in flight, reaps completions and
// resubmits the remainder of a short one. Memory is used in place (no bounce).
void uringLoop(bool write, int fd, char *memory, const Region &region, uint64_t block,
               unsigned depth) {
  io_uring ring;
  int rc = io_uring_queue_init(depth, &ring, 0);
  if (rc < 0)
    throw Error("io_uring_queue_init", -rc);
  struct Request {
    uint64_t offset, length;
  };
  std::vector<Request> requests(depth);
  std::vector<unsigned> free_slots;
  for (unsigned i = 0; i < depth; ++i)
    free_slots.push_back(i);
  auto queue = [&](unsigned slot) {
    io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    const Request &request = requests[slot];
    if (write)
      io_uring_prep_write(sqe, fd, memory + request.offset, static_cast<unsigned>(request.length),
                          request.offset);
    else
      io_uring_prep_read(sqe, fd, memory + request.offset, static_cast<unsigned>(request.length),
                         request.offset);
    io_uring_sqe_set_data64(sqe, slot);
  };
  uint64_t next = region.begin;
  unsigned in_flight = 0;
  try {
    while (next < region.end || in_flight > 0) {
      while (!free_slots.empty() && next < region.end) {
        unsigned slot = free_slots.back();
        free_slots.pop_back();
        requests[slot] = {next, std::min(block, region.end - next)};
        next += requests[slot].length;
        queue(slot);
        ++in_flight;
      }
      rc = io_uring_submit_and_wait(&ring, 1);
      if (rc < 0 && rc != -EINTR)
        throw Error("io_uring_submit_and_wait", -rc);
      io_uring_cqe *cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe(&ring, head, cqe) {
        ++seen;
        unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
        Request &request = requests[slot];
        if (cqe->res == -EAGAIN || cqe->res == -EINTR) {
          queue(slot);  // transient: same request again
        } else if (cqe->res < 0) {
          throw Error(write ? "io_uring write" : "io_uring read", -cqe->res);
        } else if (cqe->res == 0) {
          throw Error("io_uring made no progress", EIO);
        } else if (static_cast<uint64_t>(cqe->res) < request.length) {
          request.offset += static_cast<uint64_t>(cqe->res);  // short: queue the rest
          request.length -= static_cast<uint64_t>(cqe->res);
          queue(slot);
        } else {
          free_slots.push_back(slot);
          --in_flight;
        }
      }
      io_uring_cq_advance(&ring, seen);
    }
  } catch (...) {
    io_uring_queue_exit(&ring);
    throw;
  }
  io_uring_queue_exit(&ring);
}

// ---------------------------------------------------------------- measurements

struct Sample {
  double seconds = 0, cpu = 0, resident_before = -1, resident_after = -1;
  double request_kib = -1;  // average device request size during the pass
};

struct Figure {
  std::string op, mode;
  int threads = 0;
  uint64_t block_mib = 0;
  unsigned depth = 0;  // 0: not an io_uring figure
  std::vector<Sample> samples;
  std::string status = "ok";  // ok | refused | error
  std::string detail;
};

struct Memory {
  Buffer source, target, bounce_pool;
  Memory(uint64_t size, uint64_t max_block, int max_threads, bool huge)
      : source(size + kPage, huge), target(size + kPage, huge),
        bounce_pool(max_block * static_cast<uint64_t>(max_threads), huge) {}
};

std::vector<Region> split(uint64_t size, int threads) {
  // Disjoint, 4 KiB-aligned halves (thirds, ...) of the file, one per thread.
  uint64_t per = alignUp((size + threads - 1) / threads, kPage);
  std::vector<Region> regions;
  for (int i = 0; i < threads; ++i) {
    uint64_t begin = std::min(size, per * i), end = std::min(size, per * (i + 1));
    if (begin < end)
      regions.push_back({begin, end});
  }
  return regions;
}

// Runs `threads` workers over disjoint regions of fd; rethrows the first worker error.
void runWorkers(bool write, const Mode &mode, int fd, Memory &memory, uint64_t size, int threads,
                uint64_t block, unsigned depth) {
  std::vector<Region> regions = split(size, threads);
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    workers.emplace_back([&, i] {
      try {
        char *memory_base = write ? memory.source.data : memory.target.data;
        if (mode.uring)
          uringLoop(write, fd, memory_base, regions[i], block, depth);
        else if (mode.bounce)
          syncLoop(write, fd, memory_base, regions[i], block, memory.bounce_pool.data + i * block,
                   memory_base + kUserMisalign);
        else
          syncLoop(write, fd, memory_base, regions[i], block, nullptr, nullptr);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  for (std::thread &worker : workers)
    worker.join();
  for (std::exception_ptr &error : errors)
    if (error)
      std::rethrow_exception(error);
}

// One timed save-shaped write: create, write every block, fsync, close.
Sample timedWrite(const Options &options, const Mode &mode, Memory &memory, int threads,
                  uint64_t block, unsigned depth) {
  unlink(options.path.c_str());
  syncDirectoryOf(options.path);
  Sample sample;
  DiskCounters disk0 = diskCounters();
  double cpu0 = cpuSeconds(), t0 = now();
  int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (mode.direct ? O_DIRECT : 0);
  int fd = open(options.path.c_str(), flags, 0644);
  if (fd < 0)
    throw Error("open " + options.path, errno);
  try {
    if (options.fallocate_first && fallocate(fd, 0, 0, static_cast<off_t>(options.size)) != 0)
      throw Error("fallocate", errno);
    runWorkers(true, mode, fd, memory, options.size, threads, block, depth);
    if (fsync(fd) != 0)
      throw Error("fsync", errno);
  } catch (...) {
    close(fd);
    throw;
  }
  if (close(fd) != 0)
    throw Error("close", errno);
  sample.seconds = now() - t0;
  sample.cpu = cpuSeconds() - cpu0;
  DiskCounters disk1 = diskCounters();
  sample.request_kib =
      averageRequestKiB(disk1.write_ios - disk0.write_ios, disk1.write_sectors - disk0.write_sectors);
  return sample;
}

// One timed load-shaped read of the whole file; `cold` evicts it from the page cache first.
Sample timedRead(const std::string &path, uint64_t size, const Mode &mode, Memory &memory,
                 int threads, uint64_t block, unsigned depth, bool cold) {
  Sample sample;
  if (cold) {
    sample.resident_before = residentFraction(path, size);
    evict(path);
    sample.resident_after = residentFraction(path, size);
  }
  std::memset(memory.target.data, 0, memory.target.size);  // stale data cannot pass the check
  DiskCounters disk0 = diskCounters();
  double cpu0 = cpuSeconds(), t0 = now();
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | (mode.direct ? O_DIRECT : 0));
  if (fd < 0)
    throw Error("open " + path, errno);
  try {
    runWorkers(false, mode, fd, memory, size, threads, block, depth);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  sample.seconds = now() - t0;
  sample.cpu = cpuSeconds() - cpu0;
  DiskCounters disk1 = diskCounters();
  sample.request_kib =
      averageRequestKiB(disk1.read_ios - disk0.read_ios, disk1.read_sectors - disk0.read_sectors);
  const char *check = memory.target.data + (mode.bounce ? kUserMisalign : 0);
  if (!checkPattern(check, size))
    throw Error("read returned wrong bytes", EIO);
  return sample;
}

Sample timedMemcpy(Memory &memory, uint64_t size, int threads) {
  std::vector<Region> regions = split(size, threads);
  Sample sample;
  double cpu0 = cpuSeconds(), t0 = now();
  std::vector<std::thread> workers;
  for (const Region &region : regions)
    workers.emplace_back([&memory, region] {
      std::memcpy(memory.target.data + region.begin, memory.source.data + region.begin,
                  region.end - region.begin);
    });
  for (std::thread &worker : workers)
    worker.join();
  sample.seconds = now() - t0;
  sample.cpu = cpuSeconds() - cpu0;
  return sample;
}

// ---------------------------------------------------------------- alignment probe

std::string probeLine(const std::string &name, const std::string &result) {
  return "{\"bench\":\"io_modes\",\"op\":\"probe\",\"case\":\"" + name + "\",\"result\":\"" +
         result + "\"}";
}

// What O_DIRECT accepts on this file system: the kernel's statx alignment report, then a
// handful of real writes/reads that integration would need (header iovecs, odd tails).
void probeAlignment(const std::string &base) {
  std::string path = base + ".probe";
  unlink(path.c_str());
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
  if (fd < 0) {
    std::puts(probeLine("open_o_direct", errno == EINVAL ? "refused" : std::strerror(errno)).c_str());
    unlink(path.c_str());  // O_CREAT may have made it before O_DIRECT was refused
    return;
  }
  struct statx info{};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &info) == 0 && (info.stx_mask & STATX_DIOALIGN))
    std::printf("{\"bench\":\"io_modes\",\"op\":\"probe\",\"case\":\"statx_dioalign\","
                "\"dio_mem_align\":%u,\"dio_offset_align\":%u}\n",
                info.stx_dio_mem_align, info.stx_dio_offset_align);
  else
    std::puts(probeLine("statx_dioalign", "not reported").c_str());

  Buffer memory(4 * kPage, false);
  std::memset(memory.data, 'x', memory.size);
  auto attempt = [&](const std::string &name, char *data, uint64_t length, uint64_t offset) {
    ssize_t got = pwrite(fd, data, length, static_cast<off_t>(offset));
    std::puts(probeLine(name, got >= 0 ? "ok" : std::strerror(errno)).c_str());
  };
  attempt("write_aligned_4096", memory.data, kPage, 0);
  attempt("write_mem_off_512", memory.data + 512, kPage, 0);
  attempt("write_mem_off_64", memory.data + 64, kPage, 0);
  attempt("write_file_off_512", memory.data, kPage, 512);
  attempt("write_file_off_100", memory.data, kPage, 100);
  attempt("write_len_512", memory.data, 512, 0);
  attempt("write_len_100", memory.data, 100, 0);
  {  // the save's item shape as one pwritev: 100-byte header iovec + payload
    iovec iov[2] = {{memory.data, 100}, {memory.data + kPage, kPage - 100}};
    ssize_t got = pwritev(fd, iov, 2, 0);
    std::puts(probeLine("pwritev_header100_payload", got >= 0 ? "ok" : std::strerror(errno)).c_str());
  }
  {  // tail: write the last partial block padded to 4 KiB, then ftruncate to the true size
    uint64_t true_size = 2 * kPage + 123;
    bool ok = pwrite(fd, memory.data, 3 * kPage, 0) == static_cast<ssize_t>(3 * kPage) &&
              ftruncate(fd, static_cast<off_t>(true_size)) == 0 && fsync(fd) == 0;
    struct stat st{};
    ok = ok && fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == true_size;
    std::puts(probeLine("tail_pad_then_ftruncate", ok ? "ok" : "failed").c_str());
    // O_DIRECT read of an aligned length across EOF: returns the short count, not EINVAL.
    ssize_t got = pread(fd, memory.data, 4 * kPage, 0);
    std::puts(probeLine("read_aligned_len_past_eof",
                        got == static_cast<ssize_t>(true_size) ? "ok_short_count"
                                                              : (got < 0 ? std::strerror(errno)
                                                                         : "unexpected"))
                  .c_str());
  }
  close(fd);
  unlink(path.c_str());
}

// ---------------------------------------------------------------- reporting

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string key(const std::string &op, const std::string &mode, int threads, uint64_t block,
                unsigned depth) {
  return op + "/" + mode + "/" + std::to_string(threads) + "/" + std::to_string(block) + "/" +
         std::to_string(depth);
}

struct Report {
  std::vector<std::string> order;
  std::map<std::string, Figure> figures;

  Figure &at(const std::string &op, const std::string &mode, int threads, uint64_t block,
             unsigned depth) {
    std::string k = key(op, mode, threads, block, depth);
    auto it = figures.find(k);
    if (it == figures.end()) {
      order.push_back(k);
      Figure figure;
      figure.op = op;
      figure.mode = mode;
      figure.threads = threads;
      figure.block_mib = block;
      figure.depth = depth;
      it = figures.emplace(k, figure).first;
    }
    return it->second;
  }

  double medianGbs(const Figure &figure, uint64_t size) const {
    if (figure.status != "ok" || figure.samples.empty())
      return 0;
    std::vector<double> seconds;
    for (const Sample &sample : figure.samples)
      seconds.push_back(sample.seconds);
    return size / median(seconds) / kGB;
  }

  const Figure *buffered(const Figure &figure) const {
    std::string base = figure.op == "memcpy" ? "" : "buffered";
    auto it = figures.find(key(figure.op, base, figure.threads, figure.block_mib, 0));
    return it == figures.end() ? nullptr : &it->second;
  }
};

std::string jsonEscape(const std::string &text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\')
      out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20)
      out += c;
  }
  return out;
}

void printJson(const Report &report, const Options &options, const std::string &fs) {
  for (const std::string &k : report.order) {
    const Figure &figure = report.figures.at(k);
    std::printf("{\"bench\":\"io_modes\",\"fs\":\"%s\",\"op\":\"%s\",\"mode\":\"%s\","
                "\"threads\":%d,\"block_mib\":%" PRIu64 ",",
                fs.c_str(), figure.op.c_str(), figure.mode.c_str(), figure.threads,
                figure.block_mib);
    if (figure.depth)
      std::printf("\"depth\":%u,", figure.depth);
    std::printf("\"size_mib\":%" PRIu64 ",\"status\":\"%s\"", options.size / kMiB,
                figure.status.c_str());
    if (figure.status != "ok") {
      std::printf(",\"detail\":\"%s\"}\n", jsonEscape(figure.detail).c_str());
      continue;
    }
    std::vector<double> seconds, cpu, request_kib;
    double resident_before = -1, resident_after = -1;
    for (const Sample &sample : figure.samples) {
      seconds.push_back(sample.seconds);
      cpu.push_back(sample.cpu);
      if (sample.request_kib >= 0)
        request_kib.push_back(sample.request_kib);
      resident_before = std::max(resident_before, sample.resident_before);
      resident_after = std::max(resident_after, sample.resident_after);
    }
    double s_median = median(seconds), s_min = *std::min_element(seconds.begin(), seconds.end());
    std::printf(",\"reps\":%zu,\"s_median\":%.3f,\"s_min\":%.3f,\"gb_s\":%.3f,\"gb_s_best\":%.3f,"
                "\"cpu_s\":%.3f",
                seconds.size(), s_median, s_min, options.size / s_median / kGB,
                options.size / s_min / kGB, median(cpu));
    const Figure *base = report.buffered(figure);
    double base_gbs = base ? report.medianGbs(*base, options.size) : 0;
    if (base_gbs > 0)
      std::printf(",\"ratio_vs_buffered\":%.2f", report.medianGbs(figure, options.size) / base_gbs);
    if (!request_kib.empty())
      std::printf(",\"avg_request_kib\":%.0f", median(request_kib));
    if (resident_after >= 0)
      std::printf(",\"resident_before_fadvise\":%.3f,\"resident_after_fadvise\":%.3f",
                  resident_before, resident_after);
    std::printf("}\n");
  }
}

void printSummary(const Report &report, const Options &options, const std::string &fs) {
  std::printf("\n== io_modes summary: %s on %s, %" PRIu64 " MiB per pass, median of %d, GB/s "
              "(x = ratio vs buffered) ==\n",
              options.path.c_str(), fs.c_str(), options.size / kMiB, options.reps);
  for (const char *op : {"write", "read_cold", "read_warm"}) {
    std::map<std::string, std::pair<std::string, double>> best;  // row -> best mode
    std::vector<std::string> rows;
    std::map<std::string, std::string> text;
    for (const std::string &k : report.order) {
      const Figure &figure = report.figures.at(k);
      if (figure.op != op)
        continue;
      char row[64];
      std::snprintf(row, sizeof(row), "%-9s t=%d %2" PRIu64 " MiB:", op, figure.threads,
                    figure.block_mib);
      if (!text.count(row))
        rows.push_back(row);
      std::string name = figure.mode + (figure.depth ? "/qd" + std::to_string(figure.depth) : "");
      char cell[96];
      if (figure.status != "ok") {
        std::snprintf(cell, sizeof(cell), " | %s %s", name.c_str(), figure.status.c_str());
      } else {
        double gbs = report.medianGbs(figure, options.size);
        const Figure *base = report.buffered(figure);
        double base_gbs = base ? report.medianGbs(*base, options.size) : 0;
        if (figure.mode == "buffered" || base_gbs <= 0)
          std::snprintf(cell, sizeof(cell), " %s %.2f", name.c_str(), gbs);
        else
          std::snprintf(cell, sizeof(cell), " | %s %.2f (%.2fx)", name.c_str(), gbs, gbs / base_gbs);
        if (gbs > best[row].second)
          best[row] = {name, gbs};
      }
      text[row] += cell;
    }
    for (const std::string &row : rows)
      std::printf("%s%s  -> best %s\n", row.c_str(), text[row].c_str(), best[row].first.c_str());
  }
  for (const std::string &k : report.order) {
    const Figure &figure = report.figures.at(k);
    if (figure.op == "memcpy")
      std::printf("memcpy    t=%d: %.2f GB/s (in-memory ceiling)\n", figure.threads,
                  report.medianGbs(figure, options.size));
  }
}

bool wanted(const Options &options, const Mode &mode) {
  return options.modes.empty() || options.modes.count(mode.name);
}

// Runs one measurement into `figure`; an O_DIRECT open refused with EINVAL becomes "refused".
template <typename Fn> void record(Figure &figure, bool direct, Fn &&measure) {
  if (figure.status != "ok")
    return;  // refused or failed once: do not retry every rep
  try {
    figure.samples.push_back(measure());
  } catch (const Error &error) {
    bool refused = direct && error.code == EINVAL && std::string(error.what()).rfind("open", 0) == 0;
    figure.status = refused ? "refused" : "error";
    figure.detail = error.what();
    if (!refused)
      std::fprintf(stderr, "io_modes: %s %s: %s\n", figure.op.c_str(), figure.mode.c_str(),
                   error.what());
  }
}

}  // namespace

int main(int argc, char **argv) {
  Options options = parseOptions(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string fs = fsName(options.path);
  {  // the device under the file, for request-size counters
    std::string dir = options.path.substr(0, options.path.find_last_of('/') + 1);
    struct stat st{};
    if (stat(dir.empty() ? "." : dir.c_str(), &st) == 0)
      g_disk_stat_path = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                         std::to_string(minor(st.st_dev)) + "/stat";
  }
  uint64_t max_block = *std::max_element(options.block_mib.begin(), options.block_mib.end()) * kMiB;
  int max_threads = *std::max_element(options.threads.begin(), options.threads.end());
  std::string read_path = options.path + ".read";
  Report report;
  try {
    if (options.ops.count("probe"))
      probeAlignment(options.path);
    Memory memory(options.size, max_block, max_threads, options.huge_pages);
    fillPattern(memory.source.data, options.size + kPage);
    std::printf("{\"bench\":\"io_modes\",\"op\":\"memory\",\"thp_requested\":%s,"
                "\"anon_huge_mib\":%" PRIu64 "}\n",
                options.huge_pages ? "true" : "false", anonHugeKiB() / 1024);
    bool reading = options.ops.count("read") > 0;
    if (reading) {  // the file every read pass reads, written once, buffered
      Mode plain = kModes[0];
      Options prepare = options;
      prepare.path = read_path;
      prepare.fallocate_first = false;
      timedWrite(prepare, plain, memory, 1, 8 * kMiB, 1);
    }
    // Reps outermost: modes interleave, so drift on a shared machine spreads over all of them.
    for (int rep = 0; rep < options.reps; ++rep) {
      std::fprintf(stderr, "io_modes: rep %d/%d\n", rep + 1, options.reps);
      if (options.ops.count("memcpy"))
        for (int threads : options.threads)
          record(report.at("memcpy", "memcpy", threads, 0, 0), false,
                 [&] { return timedMemcpy(memory, options.size, threads); });
      for (uint64_t block_mib : options.block_mib)
        for (int threads : options.threads)
          for (const Mode &mode : kModes) {
            if (!wanted(options, mode))
              continue;
            std::vector<unsigned> depths = mode.uring ? options.depths : std::vector<unsigned>{0};
            for (unsigned depth : depths) {
              uint64_t block = block_mib * kMiB;
              if (options.ops.count("write"))
                record(report.at("write", mode.name, threads, block_mib, depth), mode.direct,
                       [&] { return timedWrite(options, mode, memory, threads, block, depth); });
              if (!reading)
                continue;
              record(report.at("read_cold", mode.name, threads, block_mib, depth), mode.direct, [&] {
                return timedRead(read_path, options.size, mode, memory, threads, block, depth, true);
              });
              if (!mode.direct)  // O_DIRECT bypasses the cache: a warm pass is the same pass
                record(report.at("read_warm", mode.name, threads, block_mib, depth), false, [&] {
                  return timedRead(read_path, options.size, mode, memory, threads, block, depth,
                                   false);
                });
            }
          }
    }
  } catch (const std::exception &error) {
    std::fprintf(stderr, "io_modes: %s\n", error.what());
    unlink(options.path.c_str());
    unlink(read_path.c_str());
    return 1;
  }
  unlink(options.path.c_str());
  unlink(read_path.c_str());
  printJson(report, options, fs);
  printSummary(report, options, fs);
  return 0;
}
