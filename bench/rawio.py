"""Raw I/O ceilings for the benchmarks (bench/gpu/gpu_bench.py, bench/checkpoint.py): the
same bytes written and fsynced, or read, by plain threads with pwrite/preadv, buffered or
with O_DIRECT, into or from page-aligned buffers in huge pages. Each function returns its
seconds, the clock started after every buffer is made and touched."""
import mmap
import os
import threading
import time

BLOCK = 64 << 20
PAGE = 4096


def aligned_block(size, fill=None):
    """A page-aligned buffer (an anonymous mapping) of SIZE bytes, touched,
    in huge pages where the kernel gives them (MADV_HUGEPAGE): a direct
    request from 4 KiB pages is cut at the device's segment limit (254
    segments, about 1 MiB, on this project's virtio disks), one from 2 MiB
    pages is not, and reads ran up to 1.6x faster (bench/README.md)."""
    block = mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            block.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # no transparent huge pages here
    block.write(fill if fill is not None else b"\x01" * size)
    return block


def write_ceiling(work, nbytes, files, direct=False, per_file=1, preallocate=False):
    """Seconds to write and fsync NBYTES into FILES files at once, 64 MiB writes
    from one non-zero buffer. PER_FILE threads write each file, each its own
    contiguous part by pwrite at its offsets (PER_FILE writes in flight per
    file, as a queue that deep would keep). DIRECT: with O_DIRECT from a
    page-aligned buffer, parts rounded up to whole pages. PREALLOCATE: each
    file's blocks reserved (posix_fallocate) before the clock starts."""
    source = memoryview(aligned_block(BLOCK, os.urandom(BLOCK)))
    per_path = -(-nbytes // files)
    paths = [os.path.join(work, f"ceiling{i}.bin") for i in range(files)]
    errors = []
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0)
    fds = []
    try:
        for i, path in enumerate(paths):
            fds.append(os.open(path, flags, 0o644))
            size = max(0, min(per_path, nbytes - i * per_path))
            if preallocate and size:
                os.posix_fallocate(fds[-1], 0, -(-size // PAGE) * PAGE)

        def writer(fd, offset, size):
            try:
                end = offset + size
                while offset < end:
                    take = min(BLOCK, end - offset)
                    if direct:
                        take = -(-take // PAGE) * PAGE
                    offset += os.pwrite(fd, source[:take], offset)
            except OSError as error:
                errors.append(error)

        jobs = []
        for i, fd in enumerate(fds):
            size = max(0, min(per_path, nbytes - i * per_path))
            # Parts in whole 64 MiB writes (pages for the last), so direct
            # offsets stay aligned.
            part = -(-size // (per_file * BLOCK)) * BLOCK
            for j in range(per_file):
                offset = j * part
                if offset < size:
                    jobs.append((fd, offset, min(part, size - offset)))
        workers = [threading.Thread(target=writer, args=job) for job in jobs]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for fd in fds:
            os.fsync(fd)
        seconds = time.perf_counter() - start
    finally:
        for fd in fds:
            os.close(fd)
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
    if errors:
        raise errors[0]
    return seconds


def read_ceiling(paths, threads, direct=False, block=BLOCK):
    """Seconds for THREADS threads to read every byte of the files (the bytes
    cut into THREADS contiguous ranges), BLOCK-byte preads into a buffer of
    each thread's own; and the bytes read. DIRECT: with O_DIRECT into
    page-aligned buffers, each range widened to whole pages."""
    extents = []  # (path, offset, length) over all files, in order
    for path in paths:
        size = os.path.getsize(path)
        extents.append((path, 0, size))
    total = sum(e[2] for e in extents)
    part = -(-total // threads)
    ranges = [[] for _ in range(threads)]
    position = 0
    for path, _, size in extents:
        offset = 0
        while offset < size:
            t = min(position // part, threads - 1)
            take = min(size - offset, (t + 1) * part - position) if t < threads - 1 else size - offset
            ranges[t].append((path, offset, take))
            offset += take
            position += take
    errors = []
    # Each thread's buffer, allocated and touched before the clock starts.
    buffers = [aligned_block(-(-min(block, max(1, part)) // PAGE) * PAGE) for _ in range(threads)]

    def reader(work, buf):
        try:
            view = memoryview(buf)
            block = len(buf)
            for path, offset, length in work:
                fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
                try:
                    end = offset + length
                    if direct:
                        end = min(-(-end // PAGE) * PAGE, -(-os.fstat(fd).st_size // PAGE) * PAGE)
                        offset = offset // PAGE * PAGE
                    while offset < end:
                        got = os.preadv(fd, [view[:min(block, end - offset)]], offset)
                        if got <= 0 and direct and offset >= os.fstat(fd).st_size:
                            break  # the file's last page, read short
                        if got <= 0:
                            raise OSError(f"short read of {path} at {offset}")
                        offset += got
                finally:
                    os.close(fd)
        except OSError as error:
            errors.append(error)

    workers = [threading.Thread(target=reader, args=(r, b)) for r, b in zip(ranges, buffers)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return seconds, total
