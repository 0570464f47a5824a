"""Page-cache control shared by the benchmarks."""
import os


def drop_cache(paths):
    """Evicts the files' pages (fsynced first, so they are clean): a cold start."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
