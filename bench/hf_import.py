#!/usr/bin/env python3
"""Hugging Face import benchmark: `fsdp-ckpt load --from-hf` GB/s against reading the same
bytes, measured in the same run.

The export benchmark's model (231M parameters; saved on 2 ranks) is exported as safetensors
(f32, then bf16), and loaded back with --from-hf into the 2-rank plan: each rank reads the byte
ranges of its own pieces (f32: straight into the main weights; bf16: cast to f32 on the way).
The ceiling: the fastest of bench/checkpoint.py's fio methods (O_DIRECT at queue depth 32 and
8, buffered) reading the same files at once. Both cold (posix_fadvise(DONTNEED) on every file
first). Prints one JSON line per figure, then a summary.

usage: bench/hf_import.py [--build DIR] [--workdir DIR] [--keep]
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile

from cache import drop_cache
from checkpoint import best_fio
from export import MPIRUN, ROOT, emit, saved_checkpoint


def ceiling(files):
    """(seconds, bytes, method): the fastest of bench/checkpoint.py's fio methods reading every
    byte of `files` at once from a dropped cache."""
    sizes = [os.path.getsize(f) for f in files]
    seconds, method = best_fio("read", files, sizes, cold_files=files)
    return seconds, sum(sizes), method


def load(tool, plan, hf, stats):
    """The slowest rank's seconds for a cold --from-hf load."""
    files = [os.path.join(hf, f) for f in os.listdir(hf)]
    drop_cache(files)
    subprocess.run(MPIRUN + ["-np", "2", tool, "load", "--plan", plan, "--from-hf", hf,
                             "--stats-json", stats], check=True, stdout=subprocess.DEVNULL)
    with open(stats) as f:
        return max(r["seconds"] for r in json.load(f)["ranks"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--workdir")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    tools = os.path.join(args.build, "bin")
    tool = os.path.join(tools, "fsdp-ckpt")
    work = args.workdir or tempfile.mkdtemp(prefix="fsdp-bench-hf-",
                                            dir=os.environ.get("TMPDIR", "/var/tmp"))
    os.makedirs(work, exist_ok=True)
    plan, ckpt = saved_checkpoint(tools, work)
    lines = []
    for dtype in ("f32", "bf16"):
        hf = os.path.join(work, "hf-" + dtype)
        shutil.rmtree(hf, ignore_errors=True)
        subprocess.run([tool, "export", ckpt, "--safetensors", hf, "--dtype", dtype], check=True,
                       stdout=subprocess.DEVNULL)
        files = sorted(os.path.join(hf, f) for f in os.listdir(hf) if f.endswith(".safetensors"))
        seconds = load(tool, plan, hf, os.path.join(work, "stats.json"))
        ceiling_s, size, method = ceiling(files)
        emit("hf_import", size / seconds / 1e9, size / ceiling_s / 1e9, ceiling_s / seconds,
             "GB/s", "ceiling", cache="cold", dtype=dtype, bytes=size, ranks=2, ceiling=method)
        lines.append(f"--from-hf ({dtype} files, cold, 2 ranks): {size / 1e9:.2f} GB in "
                     f"{seconds:.2f} s = {size / seconds / 1e9:.2f} GB/s; ceiling ({method}, "
                     f"same bytes) {ceiling_s:.2f} s = {size / ceiling_s / 1e9:.2f} GB/s; ratio "
                     f"{ceiling_s / seconds:.2f}")
    print("\n".join(lines))
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
