#!/usr/bin/env python3
"""Runtime benchmark: save and load GB/s of a ~4 GB checkpoint over 2 ranks,
against the raw ceiling measured in the same run.

The model is a Llama-shaped description (311M parameters: f32 main weights and
two f32 Adam moments, ~3.7 GB on disk). Save: `mpirun -np 2 fsdp-ckpt save`
(every byte fsynced, the commit included) against the same bytes per rank
written by 2 processes with dd (conv=fsync, 16 MiB blocks). Load: `fsdp-ckpt
load` of the same layout against 2 processes reading the same files into
buffers of their size, in the same (warm) cache state. Then PyTorch DCP (CPU, gloo, 2 processes)
saves and loads the same tensors (bench/dcp_compare.py, with torch installed
from PyPI into .venv-bench on first use), and reads our checkpoint back,
checking sampled values. Prints one JSON line per figure (README.md, Benchmarks), then
a summary.

usage: bench/checkpoint.py [--build DIR] [--repeat N] [--workdir DIR] [--no-dcp]
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]


def reported_seconds(argv):
    """The operation's own time as fsdp-ckpt reports it (slowest rank, from
    the start of the save or load to its agreed end: buffer filling, process
    start-up and the value check excluded)."""
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    match = re.search(r" in ([0-9.]+) s", out)
    if not match:
        sys.exit(f"bench: no time in the output of {' '.join(argv)}: {out}")
    return float(match.group(1))


def parallel(commands):
    """Runs the commands at once; seconds until the last one ends."""
    start = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in commands]
    for p in procs:
        if p.wait():
            sys.exit(f"bench: {' '.join(p.args)} failed")
    return time.perf_counter() - start


def compare_with_dcp(venv, ckdir, work):
    """Runs bench/dcp_compare.py with torch; None (with a note) if unavailable."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        print(f"bench: installing torch from PyPI into {venv} (once)", file=sys.stderr)
        if subprocess.run([sys.executable, "-m", "venv", venv]).returncode or subprocess.run(
                [python, "-m", "pip", "install", "-q", "torch", "numpy"]).returncode:
            print("bench: no torch: the DCP comparison is skipped", file=sys.stderr)
            return None
    out = subprocess.run([python, os.path.join(ROOT, "bench", "dcp_compare.py"), ckdir, "1", work],
                         capture_output=True, text=True)
    if out.returncode:
        print(f"bench: the DCP comparison failed:\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    figures = {}
    for line in out.stdout.splitlines():
        record = json.loads(line)
        if record["name"] == "torch_read_check":
            figures.update(checked=record["elements_checked"], keys=record["keys"])
        else:
            figures[record["name"]] = record["value"]
    return figures


def emit(name, value, ref, ratio):
    print(json.dumps({"name": name, "value": round(value, 3), "unit": "GB/s", "vs": "ceiling",
                      "ref": round(ref, 3), "ratio": round(ratio, 3)}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="where the checkpoints go (a real disk)")
    parser.add_argument("--no-dcp", action="store_true", help="skip the PyTorch DCP comparison")
    parser.add_argument("--venv", default=os.path.join(ROOT, ".venv-bench"),
                        help="Python environment with torch (created with pip if missing)")
    args = parser.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    translate, opt, ckpt = (os.path.join(bin_dir, t) for t in ("fsdp-translate", "fsdp-opt", "fsdp-ckpt"))
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
        ckdir = os.path.join(work, "ckpt")
        best = {}
        for trial in range(args.repeat):
            shutil.rmtree(ckdir, ignore_errors=True)
            t_save = reported_seconds(MPIRUN + ["-np", "2", ckpt, "save", "--plan", plan, "--dir", ckdir, "--fill", "1"])
            files = sorted(f for f in os.listdir(ckdir) if f.endswith(".distcp"))
            sizes = [os.path.getsize(os.path.join(ckdir, f)) for f in files]
            total = sum(sizes) + os.path.getsize(os.path.join(ckdir, ".metadata"))
            # Ceiling: the same bytes per rank, written and fsynced by 2 processes.
            raw = [os.path.join(work, f"raw{i}") for i in range(len(files))]
            block = 16 << 20
            t_raw_write = parallel([["dd", "if=/dev/zero", f"of={r}", f"bs={block}",
                                     f"count={(s + block - 1) // block}", "conv=fsync"]
                                    for r, s in zip(raw, sizes)])
            raw_bytes = sum(((s + block - 1) // block) * block for s in sizes)
            for r in raw:
                os.remove(r)
            # Load ceiling: 2 processes reading the checkpoint's files into
            # buffers of their size (the memory traffic a load has), in the
            # same cache state as the load that follows.
            # Buffers are touched before the clock starts, as fsdp-ckpt's are
            # allocated before its load starts; each reader reports its time.
            reader = ("import os,sys,time;p=sys.argv[1];n=os.path.getsize(p);b=bytearray(n);"
                      "b[::4096]=bytes(len(range(0,n,4096)));m=memoryview(b);"
                      "f=open(p,'rb',buffering=0);a=0;t=time.perf_counter()\n"
                      "while a<n:\n k=f.readinto(m[a:a+(16<<20)])\n if not k: break\n a+=k\n"
                      "print(time.perf_counter()-t)")
            procs = [subprocess.Popen([sys.executable, "-c", reader, os.path.join(ckdir, f)],
                                      stdout=subprocess.PIPE, text=True) for f in files]
            t_raw_read = max(float(p.communicate()[0]) for p in procs)
            t_load = reported_seconds(MPIRUN + ["-np", "2", ckpt, "load", "--plan", plan, "--dir", ckdir])
            sample = {"save": total / t_save / 1e9, "save_ceiling": raw_bytes / t_raw_write / 1e9,
                      "load": total / t_load / 1e9, "load_ceiling": sum(sizes) / t_raw_read / 1e9,
                      "bytes": total}
            for key in ("save", "load"):
                ratio = sample[key] / sample[key + "_ceiling"]
                if key not in best or ratio > best[key][2]:
                    best[key] = (sample[key], sample[key + "_ceiling"], ratio)
            best["bytes"] = total
        emit("save", *best["save"])
        emit("load", *best["load"])
        dcp = None if args.no_dcp else compare_with_dcp(args.venv, ckdir, work)
        if dcp:
            for key in ("save", "load"):
                ours = best[key][0]
                print(json.dumps({"name": key, "value": round(ours, 3), "unit": "GB/s", "vs": "dcp",
                                  "ref": round(dcp[f"dcp_{key}"], 3),
                                  "ratio": round(ours / dcp[f"dcp_{key}"], 3)}), flush=True)
        print(f"\nsummary: {best['bytes'] / 1e9:.2f} GB checkpoint over 2 ranks (best of {args.repeat}; "
              "save and load times as fsdp-ckpt reports them)")
        print(f"  save {best['save'][0]:.2f} GB/s vs dd write+fsync {best['save'][1]:.2f} GB/s "
              f"= {best['save'][2]:.2f} x ceiling (bar 0.85)")
        print(f"  load {best['load'][0]:.2f} GB/s vs raw read {best['load'][1]:.2f} GB/s "
              f"= {best['load'][2]:.2f} x ceiling (bar 0.85)")
        print("  (save: the same bytes written and fsynced by 2 dd processes; load: the same files "
              "read by 2 processes into buffers of their size)")
        if dcp:
            print(f"  PyTorch DCP on the same tensors: save {dcp['dcp_save']:.2f} GB/s "
                  f"(ours {best['save'][0] / dcp['dcp_save']:.2f}x), load {dcp['dcp_load']:.2f} GB/s "
                  f"(ours {best['load'][0] / dcp['dcp_load']:.2f}x)")
            print(f"  torch.distributed.checkpoint.load read our checkpoint at "
                  f"{dcp['torch_loads_ours']:.2f} GB/s; {dcp['checked']} sampled elements of "
                  f"{dcp['keys']} keys equal the --fill values")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
