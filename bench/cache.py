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


def warm_cache(paths):
    """Reads the files through the page cache, so they are all in it: a warm
    start (our cold loads read with direct I/O and leave the cache as it was)."""
    block = bytearray(16 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(block):
                pass
