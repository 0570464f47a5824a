"""Page-cache control shared by the benchmarks."""
import os


def drop_cache(paths):
    """Evicts the files' pages (fsynced first, so they are clean): a cold start."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # gone since it was listed (a save renaming its staging): nothing cached
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def compact_memory():
    """Asks the kernel to compact free memory (root only; elsewhere nothing)."""
    try:
        with open("/proc/sys/vm/compact_memory", "w") as f:
            f.write("1")
    except OSError:
        pass


def warm_cache(paths):
    """Reads the files through the page cache, so they are all in it: a warm
    start (our cold loads read with direct I/O and leave the cache as it was).
    Always the same start: the files are evicted first and free memory compacted, so that
    they come back in the large folios readahead asks for. A cache filled after the
    machine's memory had fragmented held them in small ones, and every copy out of it
    (ours and the ceiling's mapped method) ran 20-30% slower, mapping 4 KiB at a time."""
    drop_cache(paths)
    compact_memory()
    block = bytearray(16 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(block):
                pass
