#!/usr/bin/env python3
"""Export benchmark: `fsdp-ckpt export --safetensors` GB/s against the raw
read+write ceiling of the same bytes, measured in the same run, and its peak
memory against the largest tensor.

A Llama-shaped model (hidden 2048, 2 layers, vocab 32000: 231M parameters,
0.92 GB of f32 main weights; 2.8 GB checkpoint with the Adam moments) is saved
on 2 ranks. Cold (after posix_fadvise(DONTNEED) on every checkpoint file):
the export of the f32 weights, against reading the same number of bytes from
the checkpoint's files and then writing and fsyncing them into one file (the
export reads, then writes, one tensor at a time); for a bf16 export the same
f32 bytes read and half as many written. The export's peak RSS is
compared with its largest tensor (ratio: largest / peak; the export holds
one tensor, two when it casts). Then a bf16 export (a cast per tensor).
Prints one JSON line per figure, then a summary.

usage: bench/export.py [--build DIR] [--workdir DIR] [--keep]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from cache import drop_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
BLOCK = 16 << 20


def emit(name, value, ref, ratio, unit, vs, **extra):
    record = {"name": name, "value": round(value, 3), "unit": unit, "vs": vs,
              "ref": round(ref, 3), "ratio": round(ratio, 3), **extra}
    print(json.dumps(record), flush=True)


def data_files(ckpt):
    return sorted(os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".distcp"))


def ceiling(ckpt, count, out_path, written=None):
    """Seconds to read `count` bytes of the checkpoint's files, then write and
    fsync `written` of them (all by default) into one file (16 MiB blocks)."""
    drop_cache(data_files(ckpt))
    start = time.perf_counter()
    left, chunks = count, []
    for path in data_files(ckpt):
        with open(path, "rb", buffering=0) as f:
            while left:
                block = f.read(min(BLOCK, left))
                if not block:
                    break
                chunks.append(block)
                left -= len(block)
        if not left:
            break
    read_s = time.perf_counter() - start
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = count if written is None else written
    for block in chunks:
        os.write(fd, block[:left])
        left -= min(left, len(block))
    os.fsync(fd)
    os.close(fd)
    total = time.perf_counter() - start
    os.unlink(out_path)
    return total, read_s


def export(ckpt_tool, ckpt, out, *extra):
    """(seconds as reported, tensor bytes, largest tensor bytes, peak RSS bytes)."""
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(r.stdout, end=''); print(r.stderr, end='', file=sys.stderr)\n"
             "print('maxrss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.exit(r.returncode)\n")
    shutil.rmtree(out, ignore_errors=True)
    drop_cache(data_files(ckpt))
    result = subprocess.run([sys.executable, "-c", probe, ckpt_tool, "export", ckpt,
                             "--safetensors", out, *extra], capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"bench: export failed: {result.stderr}")
    m = re.search(r"exported .*?: (\d+) tensors, ([0-9.]+) GB in \d+ files? to .* in ([0-9.]+) s, "
                  r"[0-9.]+ GB/s \(largest tensor ([0-9.]+) GB\)", result.stdout)
    rss = re.search(r"maxrss (\d+)", result.stdout)
    if not m or not rss:
        sys.exit(f"bench: unexpected export output: {result.stdout}")
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return float(m.group(3)), size, float(m.group(4)) * 1e9, int(rss.group(1)) * 1024


def saved_checkpoint(tools, work):
    """(plan, checkpoint) of the benchmark's model on 2 ranks, saved in `work`."""
    model = os.path.join(work, "model.json")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_llama_model.py"), "--preset",
                    "tiny", "--hidden", "2048", "--intermediate", "5632", "--layers", "2",
                    "--vocab", "32000", "--heads", "16", "--kv-heads", "4", "--mesh", "dp=2",
                    "-o", model], check=True)
    plan = os.path.join(work, "plan")
    lowered = subprocess.run([os.path.join(tools, "fsdp-translate"), "--import-model-json", model],
                             check=True, capture_output=True).stdout
    lowered = subprocess.run([os.path.join(tools, "fsdp-opt"), "--fsdp-lower-fully-shard"],
                             input=lowered, check=True, capture_output=True).stdout
    subprocess.run([os.path.join(tools, "fsdp-translate"), "--emit-checkpoint-plan", "-o", plan],
                   input=lowered, check=True)
    ckpt = os.path.join(work, "ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    subprocess.run(MPIRUN + ["-np", "2", os.path.join(tools, "fsdp-ckpt"), "save", "--plan", plan,
                             "--dir", ckpt, "--fill", "1"], check=True, stdout=subprocess.DEVNULL)
    return plan, ckpt


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--workdir")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    tools = os.path.join(args.build, "bin")
    work = args.workdir or tempfile.mkdtemp(prefix="fsdp-bench-export-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    os.makedirs(work, exist_ok=True)
    tool = os.path.join(tools, "fsdp-ckpt")
    plan, ckpt = saved_checkpoint(tools, work)
    out = os.path.join(work, "export")
    seconds, size, largest, rss = export(tool, ckpt, out)
    ceiling_s, read_s = ceiling(ckpt, size, os.path.join(work, "ceiling.bin"))
    emit("export", size / seconds / 1e9, size / ceiling_s / 1e9, ceiling_s / seconds, "GB/s",
         "ceiling", cache="cold", dtype="f32", bytes=size)
    emit("export_memory", rss / 1e6, largest / 1e6, largest / rss, "MB", "largest_tensor",
         dtype="f32")
    bf16_s, bf16_size, _, bf16_rss = export(tool, ckpt, out, "--dtype", "bf16")
    # The same f32 bytes read, half of them written.
    bf16_ceiling_s, _ = ceiling(ckpt, size, os.path.join(work, "ceiling.bin"), written=bf16_size)
    emit("export", bf16_size / bf16_s / 1e9, bf16_size / bf16_ceiling_s / 1e9,
         bf16_ceiling_s / bf16_s, "GB/s", "ceiling", cache="cold", dtype="bf16", bytes=bf16_size)
    emit("export_memory", bf16_rss / 1e6, largest / 1e6, largest / bf16_rss, "MB",
         "largest_tensor", dtype="bf16")
    print(f"export (f32, cold): {size / 1e9:.2f} GB in {seconds:.2f} s = {size / seconds / 1e9:.2f} GB/s; "
          f"ceiling (read {read_s:.2f} s then write+fsync): {ceiling_s:.2f} s = "
          f"{size / ceiling_s / 1e9:.2f} GB/s; ratio {ceiling_s / seconds:.2f}")
    print(f"export peak RSS {rss / 1e6:.0f} MB (f32), {bf16_rss / 1e6:.0f} MB (bf16) against the "
          f"largest tensor {largest / 1e6:.0f} MB")
    print(f"export (bf16, cold): {bf16_size / 1e9:.2f} GB in {bf16_s:.2f} s; ratio to its ceiling "
          f"{bf16_ceiling_s / bf16_s:.2f}")
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
