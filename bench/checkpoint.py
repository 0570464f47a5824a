#!/usr/bin/env python3
"""Runtime benchmark: save and load GB/s of a ~4 GB checkpoint over 2 ranks,
at 1 worker thread per rank and at the default, against ceilings that are
limits, measured in the same run on the same bytes and cache state.

The model is a Llama-shaped description (311M parameters: f32 main weights and
two f32 Adam moments, ~3.7 GB on disk). Each round runs ours and its ceiling
in turn, figure by figure, and the ratios (ceiling time / our time) of the
rounds give a median and a spread. Of the raw methods listed for a figure, its
ceiling is the one fastest over the rounds (the lowest median of its
per-round ratios); beside it, not the bar, the median ratio against whichever
method ran fastest in each round. The disk's ceilings (save, cold load) do
not depend on our threads: each is measured once a round, between our runs at
the thread counts (1 C 2, the next round 2 C 1), and every count's figure is
against it. The warm and stall ceilings run on our threads: ours, then them,
per thread count (every other round, them first):
  save       `mpirun -np 2 fsdp-ckpt save` (every byte fsynced, the commit
             included) against the fastest of fio O_DIRECT (queue depth 32,
             32 MiB blocks; queue depth 8, 8 MiB; 4 jobs per file at queue
             depth 8; preallocated or not), fio buffered writes and the
             save's own writes without its work (fsdp-bench-direct-io: kernel
             AIO from huge pages, one queue a file at depth 8 with 8 MiB and
             its blocks reserved, at 32 with 32 MiB, 4 queues at 8) of the
             same bytes per rank into new files, fsynced, every rank's file
             at once (each method's files removed before the next writes, as
             the bench removes the previous checkpoint before each save);
  load cold  `fsdp-ckpt load` after posix_fadvise(DONTNEED) on every file
             against the fastest of the same fio methods, of deeper ones
             (2 and 4 jobs per file at queue depth 16, io_uring at 32), of
             16 and 32 threads a file reading 32 MiB direct into huge pages
             (bench/rawio.py), and of the load's own reads without its checks
             (fsdp-bench-direct-io: kernel AIO into huge pages, 4 streams a
             file at depth 8 and 16, 8 at 8), reading the checkpoint's own
             files from a dropped cache; beside
             it, not a bar, the same load reading through the page cache
             (--buffered-io);
  load warm  the load with every file in the page cache, as run by default (it
             also refreshes the bf16 model weights from the main weights it
             reads) and with --no-sync-model-weights, each against the fastest
             way to do the same work on the same cached bytes: the latter, the
             fastest copy and xxh3 of every byte out of the page cache, block by
             block (fsdp-bench-memcpy-xxh3: pread of the cached files, memcpy
             and copies with streaming stores out of a mapping of each, in 256
             KiB and 1 MiB blocks; what a checked load cannot skip); the former,
             the same but pread with each block of each rank's main weights
             also cast to bfloat16 as it lands; beside each, not a bar, the
             same work between two buffers of the process's own in huge pages
             (memcpy in 256 KiB, 1 MiB and 8 MiB blocks, streaming copies in
             256 KiB and 1 MiB), which reads other memory than the cache's;
             each of these runs, ours included, the median of WARM_PASSES in
             turn;
  save stall an async save's stall against the faster of one memcpy of each rank's bytes
             and a copy of them with streaming stores on the save's threads.
The ceilings that run a process per rank time them from one start, as the
ranks start together (each says "ready" and waits for the signal), each
process on the CPUs mpirun gives its rank.
The peers (PyTorch DCP, torch-checkpointing) run beside ours in
bench/peers.py (`bench/run peers`). Prints one JSON line per figure, then a
summary.

usage: bench/checkpoint.py [--build DIR] [--rounds N] [--workdir DIR] [--threads 1,2]
"""
import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from cache import drop_cache, warm_cache
from rawio import read_ceiling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def reported_seconds(argv):
    """The operation's own time as fsdp-ckpt reports it (slowest rank, from
    the start of the save or load, which the ranks enter together, to its
    agreed end: buffer filling, process start-up and the value check
    excluded)."""
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    match = re.search(r" in ([0-9.]+) s", out)
    if not match:
        sys.exit(f"bench: no time in the output of {' '.join(argv)}: {out}")
    return float(match.group(1))


def emit(name, value, ref, ratio, unit="GB/s", vs="ceiling", **extra):
    record = {"name": name, "value": round(value, 3), "unit": unit, "vs": vs,
              "ref": round(ref, 3), "ratio": round(ratio, 3)}
    record.update({k: v for k, v in extra.items() if v is not None})
    print(json.dumps(record), flush=True)


# Copies N bytes with one memcpy between two buffers in huge pages (as the runtime's host
# buffers are), touched beforehand; prints seconds: the async save's stall ceiling. Says
# "ready" and waits for the start signal first (run_together).
MEMCPY = ("import ctypes,mmap,sys,time;n=int(sys.argv[1]);a=mmap.mmap(-1,n);b=mmap.mmap(-1,n);"
          "a.madvise(mmap.MADV_HUGEPAGE);b.madvise(mmap.MADV_HUGEPAGE);"
          "pa=ctypes.addressof((ctypes.c_char*n).from_buffer(a));"
          "pb=ctypes.addressof((ctypes.c_char*n).from_buffer(b));"
          "ctypes.memset(pa,1,n);ctypes.memset(pb,2,n);print('ready',flush=True);"
          "sys.stdin.readline();t=time.perf_counter();"
          "ctypes.memmove(pb,pa,n);print(time.perf_counter()-t)")

# The raw methods each ceiling is the best of (fio, every file a job of its own, all at once).
WRITE_METHODS = {
    "fio O_DIRECT qd32 32M": ["--direct=1", "--ioengine=libaio", "--iodepth=32", "--bs=32M"],
    # Preallocated, as our save reserves its files.
    "fio O_DIRECT qd32 32M fallocate": ["--direct=1", "--ioengine=libaio", "--iodepth=32",
                                        "--bs=32M", "--fallocate=native"],
    "fio O_DIRECT qd8 8M": ["--direct=1", "--ioengine=libaio", "--iodepth=8", "--bs=8M"],
    "fio buffered 16M": ["--direct=0", "--ioengine=psync", "--bs=16M"],
    # Several streams per file, as our workers write and read items at once
    # (this project's virtual disks serve parallel streams faster).
    "fio O_DIRECT 4 jobs/file qd8 8M": ["--direct=1", "--ioengine=libaio", "--iodepth=8",
                                        "--bs=8M", "--numjobs=4"],
    "fio O_DIRECT 4 jobs/file qd8 8M fallocate": ["--direct=1", "--ioengine=libaio",
                                                  "--iodepth=8", "--bs=8M", "--numjobs=4",
                                                  "--fallocate=native"],
}
READ_METHODS = {k: v for k, v in WRITE_METHODS.items() if "fallocate" not in k}
READ_METHODS.update({
    # Our cold load's own shape (two regions of each file, 16 requests in flight) and deeper
    # ones, through both kernel interfaces: no fewer ways to read than ours has.
    "fio O_DIRECT 2 jobs/file qd16 8M": ["--direct=1", "--ioengine=libaio", "--iodepth=16",
                                         "--bs=8M", "--numjobs=2"],
    "fio O_DIRECT 4 jobs/file qd16 8M": ["--direct=1", "--ioengine=libaio", "--iodepth=16",
                                         "--bs=8M", "--numjobs=4"],
    "fio O_DIRECT io_uring 2 jobs/file qd32 8M": ["--direct=1", "--ioengine=io_uring",
                                                  "--iodepth=32", "--bs=8M", "--numjobs=2"],
})


# Reads by plain threads into huge-page buffers (bench/rawio.py): fio's buffers are in 4 KiB
# pages, so each of its direct requests is cut at the disk's segment limit (254 segments,
# about 1 MiB, here), as the runtime's, in huge pages, are not. {name: (threads per file,
# pread size)}.
THREAD_READ_METHODS = {
    "O_DIRECT huge pages 16 threads/file 32M": (16, 32 << 20),
    "O_DIRECT huge pages 32 threads/file 32M": (32, 32 << 20),
}
# The load's own read shape and deeper ones, without its checks and copies: kernel AIO into
# huge pages (fsdp-bench-direct-io). {name: its arguments}.
AIO_READ_METHODS = {
    "O_DIRECT AIO huge pages 4 streams/file qd8 8M": ["--streams", "4", "--depth", "8",
                                                      "--block-mib", "8"],
    "O_DIRECT AIO huge pages 4 streams/file qd16 16M": ["--streams", "4", "--depth", "16",
                                                        "--block-mib", "16"],
    "O_DIRECT AIO huge pages 8 streams/file qd8 8M": ["--streams", "8", "--depth", "8",
                                                      "--block-mib", "8"],
}
# The save's own write shape (one queue of 8 MiB writes a file, 8 in flight, its blocks
# reserved first) and wider or deeper ones, from huge pages as the save writes, so that each
# request reaches the disk whole: kernel AIO (fsdp-bench-direct-io --write).
AIO_WRITE_METHODS = {
    "O_DIRECT AIO huge pages qd8 8M reserved": ["--streams", "1", "--depth", "8",
                                                "--block-mib", "8", "--reserve"],
    "O_DIRECT AIO huge pages qd32 32M": ["--streams", "1", "--depth", "32", "--block-mib", "32"],
    "O_DIRECT AIO huge pages 4 streams/file qd8 8M reserved": ["--streams", "4", "--depth", "8",
                                                               "--block-mib", "8", "--reserve"],
}


def direct_io_seconds(tools, argv, files, sizes):
    """Seconds of fsdp-bench-direct-io moving every byte of `files` (`argv` says how)."""
    out = subprocess.run([os.path.join(tools, "fsdp-bench-direct-io"), *argv, *files],
                         check=True, capture_output=True, text=True).stdout.split()
    if int(out[1]) < sum(sizes):
        sys.exit(f"bench: fsdp-bench-direct-io moved {out[1]} of {sum(sizes)} bytes")
    return float(out[0])


def fio_seconds(rw, files, sizes, method):
    """Seconds of fio doing `rw` on every file at once, as fio itself times the I/O (its
    start-up and file handling left out; the end fsync of a write included): the bytes over
    its aggregate bandwidth. No preallocation for writes unless the method asks for it."""
    argv = ["fio", "--output-format=json", "--group_reporting", "--fallocate=none",
            "--end_fsync=1" if rw == "write" else "--invalidate=0"]
    jobs = next((int(a.split("=")[1]) for a in method if a.startswith("--numjobs=")), 1)
    for i, (path, size) in enumerate(zip(files, sizes)):
        # N jobs on one file: each its own 4 KiB-aligned slice, the slices
        # covering the file but for under 4 KiB per job.
        part = size // jobs // 4096 * 4096 if jobs > 1 else size
        argv += [f"--name=j{i}", f"--filename={path}", f"--rw={rw}", f"--size={part}"] + method
        if jobs > 1:
            argv.append(f"--offset_increment={part}")
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0][rw]
    if not job["bw_bytes"]:
        sys.exit(f"bench: fio measured nothing: {' '.join(argv)}")
    return job["io_bytes"] / job["bw_bytes"]


def fio_methods(rw, files, sizes, cold_files=None, tools=None):
    """{method: seconds} of every raw method, each run in the same cache state (also the AIO
    ones, with the bench programs in `tools`). Writes go to new files, as a save's do: each
    method's files are removed before the next one writes (and after the last)."""
    times = {}
    for name, method in WRITE_METHODS.items() if rw == "write" else READ_METHODS.items():
        if cold_files:
            drop_cache(cold_files)
        times[name] = fio_seconds(rw, files, sizes, method)
        if rw == "write":
            remove_files(files)
    if rw == "write":
        sized = ["--write"] + [a for size in sizes for a in ("--size", str(size))]
        for name, argv in AIO_WRITE_METHODS.items() if tools else ():
            times[name] = direct_io_seconds(tools, sized + argv, files, sizes)
            remove_files(files)
    else:
        for name, (per_file, block) in THREAD_READ_METHODS.items():
            if cold_files:
                drop_cache(cold_files)
            times[name] = read_ceiling(files, per_file * len(files), True, block)[0]
        for name, argv in AIO_READ_METHODS.items() if tools else ():
            if cold_files:
                drop_cache(cold_files)
            times[name] = direct_io_seconds(tools, argv, files, sizes)
    return times


def remove_files(files):
    for path in files:
        if os.path.exists(path):
            os.remove(path)


def fastest(times):
    """(seconds, method) of the fastest of {method: seconds}."""
    return min((seconds, name) for name, seconds in times.items())


def best_fio(rw, files, sizes, cold_files=None):
    """(seconds, method) of the fastest raw method, each run in the same cache state."""
    return fastest(fio_methods(rw, files, sizes, cold_files))


@functools.lru_cache(maxsize=None)
def rank_cpus(ranks):
    """The CPUs mpirun lets each of `ranks` ranks run on, as it places a save's or load's
    (for 2 ranks Open MPI binds each to a core of its own)."""
    probe = ("import os; print(os.environ['OMPI_COMM_WORLD_RANK'], "
             "*sorted(os.sched_getaffinity(0)))")
    out = subprocess.run(MPIRUN + ["-np", str(ranks), sys.executable, "-c", probe],
                         check=True, capture_output=True, text=True).stdout
    # Lines of the form "RANK CPU...": anything else mpirun printed is skipped.
    cpus = {int(rank): frozenset(map(int, rest))
            for rank, *rest in (line.split() for line in out.splitlines() if line.strip())
            if rank.isdigit() and rest and all(cpu.isdigit() for cpu in rest)}
    if sorted(cpus) != list(range(ranks)):
        sys.exit(f"bench: mpirun did not report each rank's CPUs: {out}")
    return tuple(cpus[rank] for rank in range(ranks))


def run_together(argvs):
    """The slowest of one process per rank, timed from one start: each sets up, says
    "ready" and waits; all get the start signal at once (as the ranks of a save or load start
    together), and each prints its seconds. Each runs on the CPUs mpirun gives its rank: a
    ceiling gets the machine as the ranks get it. Unbound, a process done first left its core
    to the other's threads, which no bound rank can take (warm loads by hand, 2 threads, 10
    interleaved rounds: the load 0.363 s, the copies bound 0.321 s, unbound 0.310 s; 12
    more: the load's slower rank 0.367 s, the bound copies' slower process 0.358 s)."""
    cpus = rank_cpus(len(argvs))
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              preexec_fn=functools.partial(os.sched_setaffinity, 0, cpus[rank]))
             for rank, argv in enumerate(argvs)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            sys.exit(f"bench: {' '.join(argvs[0])} did not get ready")
    for p in procs:
        p.stdin.write("\n")
        p.stdin.close()
    seconds = [float(p.stdout.read()) for p in procs]
    if any(p.wait() for p in procs):
        sys.exit(f"bench: {' '.join(argvs[0])} failed")
    return max(seconds)


# The warm load's ceiling is the fastest of these ways to copy every byte of each rank out of
# the page cache and hash it, block by block (fsdp-bench-memcpy-xxh3, the ranks at once): the
# same bytes in the same cache state, as a ceiling reads them. Smaller blocks stay in a core's
# cache; streaming stores write the copy without first reading each of its lines (the load's
# own copies); pread is the kernel's copy out of the cache.
WARM_METHODS = {
    "pread + xxh3 256K": ["--block", "256", "--pread"],
    "pread + xxh3 1M": ["--block", "1024", "--pread"],
    # The load's own way: copied out of one mapping of each cached file, whose page faults
    # (one per 2 MiB folio of the cache, one per few pages of smaller ones) count.
    "mmap + xxh3 256K": ["--block", "256", "--mmap"],
    "mmap + xxh3 1M": ["--block", "1024", "--mmap"],
    "mmap streaming copy + xxh3 256K": ["--block", "256", "--stream", "--mmap"],
    "mmap streaming copy + xxh3 1M": ["--block", "1024", "--stream", "--mmap"],
}
# Beside it, not a bar: the same copy and hash between two buffers of the process's own (huge
# pages, filled before the clock), which reads neither the checkpoint's bytes nor the memory
# the kernel caches them in. Out of the page cache the same streaming copy ran 5-20% slower
# than between buffers (6 interleaved runs of 8-12 rounds, 1 thread), yet out of a copy of
# the same files whose cache a write had filled, within 0-7%, and a copy read back the same
# way as the checkpoint, 9% faster than the checkpoint, with as much of each in 2 MiB folios:
# what is left is the memory the cache sits in, which no reader of the cache picks.
MEMORY_METHODS = {
    "memcpy + xxh3 256K": ["--block", "256"],
    "memcpy + xxh3 1M": ["--block", "1024"],
    "memcpy + xxh3 8M": ["--block", "8192"],
    "streaming copy + xxh3 256K": ["--block", "256", "--stream"],
    "streaming copy + xxh3 1M": ["--block", "1024", "--stream"],
}


def memcpy_xxh3_seconds(tool, sizes, threads, method, files, casts=None):
    """Seconds of one WARM_METHODS or MEMORY_METHODS method over every rank's bytes, the ranks
    at once (a pread or mmap method reads `files`, one per rank, from the page cache). With
    `casts`: each block of that many of each rank's float32 elements also cast to bfloat16
    as it lands."""
    cast = [["--cast", str(casts[rank])] if casts else [] for rank in range(len(files))]
    if "--pread" in method or "--mmap" in method:
        return run_together([[tool] + cast[rank] + method + [f, str(threads)]
                             for rank, f in enumerate(files)])
    return run_together([[tool] + cast[rank] + method + [str(size), str(threads)]
                         for rank, size in enumerate(sizes)])


# Each warm run, ours and every method's, is made this many times a round, in turn (the
# direction alternating), and counts by its median. On this VM one run of a copy bound by
# memory took up to 2x another of the same program, whichever program (the slow ones came
# while the host was being handed back the memory the run before had freed: page_reporting),
# so one run a round could decide the figure by that alone.
WARM_PASSES = 3
# The name of a method that also casts the main weights.
CAST = " + bf16 cast"


def warm_figures(ckpt, plan, ckdir, tool, sizes, files, casts, threads, ours_first):
    """The round's warm figures (against(...)): the load as run by default, which also
    refreshes the bf16 model weights from the main weights it reads, against the same copy
    and xxh3 of every byte out of the cache with the cast of the main weights as they land;
    the load without that refresh (--no-sync-model-weights) against the copy and xxh3 alone;
    and, not bars, each against the same work between buffers (MEMORY_METHODS)."""
    def load(*extra):
        return lambda: reported_seconds(MPIRUN + ["-np", "2", ckpt, "load", "--plan", plan,
                                                  "--dir", ckdir, "--threads", str(threads),
                                                  *extra])
    runs = {"ours": load(), "ours, no refresh": load("--no-sync-model-weights")}
    for name, method in {**WARM_METHODS, **MEMORY_METHODS}.items():
        runs[name] = functools.partial(memcpy_xxh3_seconds, tool, sizes, threads, method, files)
        if "--pread" not in method:  # the kernel's copy cannot cast
            runs[name + CAST] = functools.partial(memcpy_xxh3_seconds, tool, sizes, threads,
                                                  method, files, casts)
    order = list(runs) if ours_first else list(runs)[::-1]
    times = {name: [] for name in runs}
    for done in range(WARM_PASSES):
        for name in order if done % 2 == 0 else order[::-1]:
            times[name].append(runs[name]())
    median = {name: statistics.median(seconds) for name, seconds in times.items()}
    total = sum(sizes)

    def methods(among, cast):
        return {name + cast: median[name + cast] for name in among
                if name + cast in median}
    figures = {}
    for suffix, among in (("", WARM_METHODS), ("_memory", MEMORY_METHODS)):
        figures["load_warm" + suffix] = against(median["ours"], methods(among, CAST), total)
        figures["load_warm_no_refresh" + suffix] = against(median["ours, no refresh"],
                                                           methods(among, ""), total)
    return figures


def cast_elements_per_rank(translate, lowered):
    """Each rank's main-weight elements that a load casts into a bfloat16 model weight."""
    plan = json.loads(subprocess.run([translate, "--emit-checkpoint-plan", lowered,
                                      "--plan-format=json", "-o", "-"], check=True,
                                     capture_output=True, text=True).stdout)
    casts = []
    for rank in sorted(plan["ranks"], key=lambda r: r["rank"]):
        main = {b["group"]: b for b in rank["buffers"] if b["role"] == "main_weight"}
        casts.append(sum(min(b["elements"], main[b["group"]]["elements"])
                         for b in rank["buffers"]
                         if b["role"] == "model_weight" and b["dtype"] == "bfloat16"
                         and main.get(b["group"], {}).get("dtype") == "float32"))
    return casts


STALL_CEILING_TRIES = 3


def measure_stall(ckpt, plan, ckdir, work, threads):
    """An async save (snapshot reserved before the clock, as a training job
    reserves it at start-up): the slowest rank's stall, and (seconds, method) of the faster
    copy of each rank's saved bytes, the ranks' copies running at once: one memcpy (glibc
    streams past the cache only above its threshold, 192 MiB here), or 64 MiB blocks copied
    with streaming stores on the save's threads, as the capture copies."""
    shutil.rmtree(ckdir, ignore_errors=True)
    stats_path = os.path.join(work, "async-stats.json")
    out = subprocess.run(MPIRUN + ["-np", "2", ckpt, "save", "--plan", plan, "--dir", ckdir,
                                   "--fill", "1", "--threads", str(threads), "--async",
                                   "--stats-json", stats_path],
                         check=True, capture_output=True, text=True).stdout
    match = re.search(r"stall ([0-9.]+) s, total ([0-9.]+) s", out)
    if not match:
        sys.exit(f"bench: no stall in the output of the async save: {out}")
    ranks = json.load(open(stats_path))["ranks"]
    methods = {
        "one memcpy": [[sys.executable, "-c", MEMCPY, str(r["bytes_written_storage"])]
                       for r in ranks],
        "streaming copy": [[os.path.join(os.path.dirname(ckpt), "fsdp-bench-memcpy-xxh3"),
                            "--stream", "--no-hash", "--block", str(64 << 10),
                            str(r["bytes_written_storage"]), str(threads)] for r in ranks],
    }
    # Each the best of a few tries: the capture is the same streaming copy, so a single try
    # of the ceiling put ours above it by the machine's noise alone (1.07 in one run).
    copies = {name: min(run_together(argvs) for _ in range(STALL_CEILING_TRIES))
              for name, argvs in methods.items()}
    return float(match.group(1)), fastest(copies)


def against(ours, times, total):
    """A figure of a round: (our seconds, the fastest method's seconds, bytes, that method,
    {method: seconds} of every method)."""
    seconds, method = fastest(times)
    return (ours, seconds, total, method, times)


def split_counts(thread_counts, ours_first):
    """The thread counts whose runs come before a shared ceiling, and those after it: T1 C T2
    in one round, T2 C T1 in the next (with one count: T C, then C T), so that each thread
    count meets the ceiling before it in half the rounds and after it in the other half."""
    order = list(thread_counts) if ours_first else list(thread_counts)[::-1]
    before = (len(order) + ours_first) // 2
    return order[:before], order[before:]


def round_trip(tools, plan, casts, ckdir, work, thread_counts, ours_first=True):
    """One round at each of `thread_counts` workers per rank: {threads: {figure:
    against(...)}}; the references beside them have no methods (None). The disk's ceilings
    do not depend on our threads, so each is measured once a round between our runs
    (split_counts), every thread count's figure against the same one; the warm and stall
    ceilings run on our threads and are measured per thread count, ours and each in turn
    (A B A B; the next round B A)."""
    ckpt = os.path.join(tools, "fsdp-ckpt")
    before, after = split_counts(thread_counts, ours_first)

    def save(threads):
        # Each save writes a new checkpoint, as the previous one is removed first.
        shutil.rmtree(ckdir, ignore_errors=True)
        return reported_seconds(MPIRUN + ["-np", "2", ckpt, "save", "--plan", plan, "--dir",
                                          ckdir, "--fill", "1", "--threads", str(threads)])

    def data_files():
        return sorted(os.path.join(ckdir, f) for f in os.listdir(ckdir) if f.endswith(".distcp"))

    def saves(counts):
        times = {}
        for threads in counts:
            times[threads] = save(threads)
            written = [os.path.getsize(f) for f in data_files()]
            if sizes and written != sizes:
                sys.exit(f"bench: a save at {threads} threads wrote {written} bytes per file, "
                         f"the save before it {sizes}")
            sizes[:] = written
        return times

    # The sizes a save of this plan writes: the previous round's checkpoint's (before the
    # first, the warm-up save's).
    sizes = [os.path.getsize(f) for f in data_files()]
    t_save = saves(before)
    # The same bytes per rank, written by each raw method into new files, fsynced.
    raw = [os.path.join(work, f"raw{i}") for i in range(len(sizes))]
    writes = fio_methods("write", raw, sizes, tools=tools)
    t_save.update(saves(after))
    files = data_files()
    total = sum(sizes)
    every_file = [os.path.join(ckdir, f) for f in os.listdir(ckdir)]

    def cold_load(threads, *extra):
        drop_cache(every_file)
        return reported_seconds(MPIRUN + ["-np", "2", ckpt, "load", "--plan", plan, "--dir",
                                          ckdir, "--threads", str(threads), *extra])
    # Cold load: the checkpoint's own files read by each raw method, after the cache is
    # dropped.
    t_cold = {threads: cold_load(threads) for threads in before}
    reads = fio_methods("read", files, sizes, cold_files=every_file, tools=tools)
    t_cold.update({threads: cold_load(threads) for threads in after})
    figures = {}
    for threads in thread_counts:
        figures[threads] = {"save": against(t_save[threads], writes, total),
                            "load_cold": against(t_cold[threads], reads, total)}
    for threads in thread_counts:
        # Beside it (not a bar): the same cold load reading through the page cache.
        figures[threads]["load_cold_buffered"] = against(cold_load(threads, "--buffered-io"),
                                                         reads, total)
        # Warm loads: every byte copied from the page cache and checked, nothing less.
        # warm_cache refills the cache from nothing: pages the buffered load above brought in
        # through posix_fadvise(WILLNEED) are small folios, and warm loads from them ran 30%
        # slower (4.3-4.7 against 5.0-6.7 GB/s) than from pages read in by plain reads.
        warm_cache(every_file)
        figures[threads].update(warm_figures(
            ckpt, plan, ckdir, os.path.join(tools, "fsdp-bench-memcpy-xxh3"), sizes, files,
            casts, threads, ours_first))
    for threads in thread_counts:
        stall, (t_copy, copy) = measure_stall(ckpt, plan, ckdir, work, threads)
        figures[threads]["save_stall"] = (stall, t_copy, None, copy, None)
    return figures


# Each figure of a round: (JSON name, cache, variant, vs, bar), in the order printed. The
# memory-to-memory lines stand beside the warm loads' bars (MEMORY_METHODS).
FIGURES = {
    "save": ("save", None, None, "ceiling", 0.9),
    "load_cold": ("load", "cold", None, "ceiling", 0.9),
    "load_cold_buffered": ("load", "cold", "--buffered-io", "ceiling", None),
    "load_warm": ("load", "warm", None, "ceiling", 0.9),
    "load_warm_memory": ("load", "warm", None, "memory-to-memory", None),
    "load_warm_no_refresh": ("load", "warm", "--no-sync-model-weights", "ceiling", 0.9),
    "load_warm_no_refresh_memory": ("load", "warm", "--no-sync-model-weights",
                                    "memory-to-memory", None),
    "save_stall": ("save_stall", None, None, "ceiling", 0.67),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--workdir", default=None, help="where the checkpoints go (a real disk)")
    parser.add_argument("--threads", default=None,
                        help="comma-separated worker threads per rank (default: 1 and the cores)")
    args = parser.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    translate, opt = (os.path.join(bin_dir, t) for t in ("fsdp-translate", "fsdp-opt"))
    work = tempfile.mkdtemp(prefix="fsdp-bench-ckpt-", dir=args.workdir)
    try:
        model = os.path.join(work, "model.json")
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_llama_model.py"),
                        "--preset", "tiny", "--hidden", "2048", "--intermediate", "5632",
                        "--layers", "4", "--vocab", "32000", "--heads", "16", "--kv-heads", "4",
                        "--mesh", "dp=2", "-o", model], check=True)
        lowered = os.path.join(work, "lowered.mlir")
        plan = os.path.join(work, "model.fsdpplan")
        subprocess.run(f"{translate} --import-model-json {model} | {opt} --fsdp-lower-fully-shard -o {lowered}",
                       shell=True, check=True)
        subprocess.run([translate, "--emit-checkpoint-plan", lowered, "-o", plan], check=True)
        casts = cast_elements_per_rank(translate, lowered)
        ckdir = os.path.join(work, "ckpt")
        default_threads = min(8, os.cpu_count() or 1)
        thread_counts = (sorted({int(t) for t in args.threads.split(",")}) if args.threads
                         else sorted({1, default_threads}))
        summary = []
        # One save before the rounds, not measured: it gives the first round's write
        # ceiling the sizes to write, and no figure counts the run's first write to the disk.
        subprocess.run(MPIRUN + ["-np", "2", os.path.join(bin_dir, "fsdp-ckpt"), "save",
                                 "--plan", plan, "--dir", ckdir, "--fill", "1"],
                       check=True, capture_output=True)
        rounds = []
        for i in range(args.rounds):
            started = time.monotonic()
            rounds.append(round_trip(bin_dir, plan, casts, ckdir, work, thread_counts,
                                     ours_first=i % 2 == 0))
            print(f"bench: round {i + 1} of {args.rounds} in {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)
        for threads in thread_counts:
            summary.append(f"  {threads} thread{'s' if threads > 1 else ''} per rank:")
            for figure in FIGURES:
                samples = [r[threads][figure] for r in rounds]
                # Against whichever method ran fastest in each round.
                ratios = [ceiling / ours for ours, ceiling, *_ in samples]
                fastest_each_round = statistics.median(ratios)
                methods = sorted({s[3] for s in samples})
                name, cache, variant, vs, bar = FIGURES[figure]
                if figure == "save_stall":
                    ours = statistics.median(s[0] for s in samples)
                    ref = statistics.median(s[1] for s in samples)
                    emit("save_stall", ours, ref, fastest_each_round, unit="s", vs=vs,
                         threads=threads, bar=bar, min=round(min(ratios), 3), max=round(max(ratios), 3),
                         rounds=len(ratios), ceiling=" / ".join(methods))
                    summary.append(f"    async save stall {ours:.3f} s vs {ref:.3f} s "
                                   f"({' / '.join(methods)}): "
                                   f"ratio {fastest_each_round:.2f} "
                                   f"({min(ratios):.2f}-{max(ratios):.2f}; bar >= 0.67, "
                                   "a stall of at most 1.5x)")
                    continue
                total = samples[0][2]
                ours = statistics.median(total / s[0] / 1e9 for s in samples)
                # The ceiling is the one method fastest over the rounds: the median of its
                # per-round ratios is the lowest of any method's. Beside it (not the bar):
                # against whichever method ran fastest in each round, an order statistic of
                # the methods' noise that sinks as methods are added, even copies of one
                # (ratios of the run that chose: docs/Benchmarks.md, 2026-12-06 evening).
                per_method = {m: [s[4][m] / s[0] for s in samples] for m in samples[0][4]}
                by_method = {m: statistics.median(r) for m, r in per_method.items()}
                best = min(by_method, key=by_method.get)
                ratio, spread = by_method[best], per_method[best]
                ref = statistics.median(total / s[4][best] / 1e9 for s in samples)
                emit(name, ours, ref, ratio, vs=vs, threads=threads, cache=cache,
                     variant=variant, bar=bar, min=round(min(spread), 3),
                     max=round(max(spread), 3), rounds=len(spread), ceiling=best,
                     ratio_fastest_each_round=round(fastest_each_round, 3),
                     fastest_each_round=" / ".join(methods))
                beside = [variant] if variant else []
                if vs != "ceiling":
                    beside.append(f"vs {vs}")
                label = "  " + " ".join(beside) if beside else f"{figure:10s}"
                summary.append(f"    {label} {ours:.2f} GB/s vs {ref:.2f} GB/s ({best}): "
                               f"ratio {ratio:.2f} ({min(spread):.2f}-{max(spread):.2f}; "
                               f"{f'bar {bar}' if bar else 'not a bar'}); against the "
                               f"fastest method of each round {fastest_each_round:.2f} "
                               f"({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"\nsummary: {total / 1e9:.2f} GB checkpoint over 2 ranks, {args.rounds} rounds, ours "
              "and its ceiling in turn; medians (min-max of the per-round ratios)")
        print("\n".join(summary))
        print("  ceilings (each figure's, the one method fastest over the rounds among these): "
              "save, fio O_DIRECT (queue depth 32 and 8, and 4 jobs per "
              "file; preallocated or not), buffered, and kernel AIO from huge pages as the save "
              "writes, of the same bytes per rank into new files, fsynced; cold load, the "
              "same "
              "methods and deeper ones (2 and 4 jobs per file at queue depth 16, io_uring at 32; 16 and 32 threads a file into huge pages; "
              "kernel AIO into huge pages, as the load reads, without its checks) "
              "reading the checkpoint's own files after the cache is dropped; warm load "
              "(--no-sync-model-weights), "
              "copy and xxh3 of every byte out of the page cache (pread of the "
              "cached files, memcpy and streaming copies out of a mapping of each, in 256 KiB "
              "and 1 MiB blocks: what a checked load cannot skip); "
              "warm load as run by default, the same but pread with each "
              "block of main weights also cast to the bf16 model weights, as the load "
              "refreshes them; beside each, not a bar, the same between buffers of the "
              "process's own (memcpy in 256 KiB, 1 MiB and 8 MiB blocks, streaming copies in "
              f"256 KiB and 1 MiB); each warm run the median of {WARM_PASSES} in turn; "
              "async stall, the faster of one memcpy of each rank's bytes and "
              "a copy of them in 64 MiB blocks with streaming stores on the save's threads; "
              "the warm and stall ceilings run a process per rank, each on its rank's CPUs")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
