#!/usr/bin/env python3
"""One-GPU checks and figures for bench/gpu/run (docs/GPU.md).

1. Round trips with --check on the small plan (world size 1): save/load on
   DEVICE buffers, verify, the 1 -> 1 reshard into another packing of the same
   keys (the "-regroup" plan: one fully_shard unit instead of one per layer)
   and its load, a direct load into that packing, a load forcing the NCCL data
   plane (--replica-plane nccl), and async saves (one with the buffers
   overwritten as soon as it returns). Each step PASS/FAIL/SKIP.
2. The one-H200 figures (docs/GPU.md, "The bars") on the "bench" plan
   (~6.44 GB on one rank), each against a reference measured in this run on
   the same bytes: save vs the disk ceiling (THREADS threads writing and
   fsyncing that byte count) and vs PyTorch DCP; load cold and warm vs the read
   ceiling (THREADS threads reading the checkpoint's files, same cache state:
   posix_fadvise(DONTNEED) before both cold reads) and vs DCP; the async save's
   stall (first save, and a repeated save over it) vs a pinned device-to-host
   copy of the shard's bytes and vs DCP's async_save.
Prints one JSON line per figure (README.md, Benchmarks), then a human summary;
writes OUT/gpu-bench.jsonl, OUT/gpu-roundtrip.jsonl and OUT/gpu-summary.txt.
Exit status 1 if any step failed (bars missed are reported, not failures).

usage: gpu_bench.py --ckpt BIN --plans DIR --device cuda|cpu --out DIR
                    [--workdir DIR] [--threads 8] [--figures-plan bench|small]
                    [--deadline EPOCH_SECONDS] [--no-dcp] [--skip-roundtrip]
                    [--skip-figures]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cache import drop_cache  # noqa: E402 (bench/cache.py)
from rawio import read_ceiling, write_ceiling  # noqa: E402 (bench/rawio.py)

HERE = os.path.dirname(os.path.abspath(__file__))
GB = 1e9

# The one-H200 bars (docs/GPU.md, "The bars").
BAR_SAVE_VS_CEILING = 0.9
BAR_LOAD_VS_CEILING = 0.9
BAR_LOAD_VS_DCP = 3.0
BAR_STALL_S_PER_GB = 0.05


def note(message):
    print(f"gpu_bench: {message}", file=sys.stderr, flush=True)


class Runner:
    """Runs fsdp-ckpt commands and keeps every step's outcome."""

    def __init__(self, args):
        self.args = args
        self.failures = []
        self.steps = []
        self.figures = []
        self.deadline = args.deadline or (time.time() + 1e9)
        os.makedirs(args.out, exist_ok=True)
        self.roundtrip_log = open(os.path.join(args.out, "gpu-roundtrip.jsonl"), "w")
        self.figure_log = open(os.path.join(args.out, "gpu-bench.jsonl"), "w")
        help_text = self.help("save") + self.help("load")
        self.has_device = "--device" in help_text
        self.has_replica_plane = "--replica-plane" in self.help("load")

    def help(self, sub):
        out = subprocess.run([self.args.ckpt, sub, "--help"], capture_output=True, text=True)
        return out.stdout + out.stderr

    def left(self):
        return self.deadline - time.time()

    def device_flags(self):
        if self.has_device:
            return ["--device", self.args.device]
        return []

    def ckpt(self, *argv, timeout=None):
        """(rc, stdout, stderr, wall seconds) of one fsdp-ckpt command."""
        cmd = [self.args.ckpt] + [str(a) for a in argv]
        note("$ " + " ".join(cmd))
        start = time.perf_counter()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True,
                                 timeout=timeout or max(60.0, self.left()))
            rc, stdout, stderr = out.returncode, out.stdout, out.stderr
        except subprocess.TimeoutExpired as expired:
            rc, stdout, stderr = 124, expired.stdout or "", (expired.stderr or "") + " (timed out)"
            stdout = stdout if isinstance(stdout, str) else stdout.decode(errors="replace")
            stderr = stderr if isinstance(stderr, str) else stderr.decode(errors="replace")
        wall = time.perf_counter() - start
        for line in (stdout + stderr).strip().splitlines()[-6:]:
            note("  " + line)
        return rc, stdout, stderr, wall

    def step(self, name, ok, detail="", **extra):
        status = "PASS" if ok is True else ("SKIP" if ok is None else "FAIL")
        record = {"step": name, "status": status, "detail": detail.strip()[-600:]}
        record.update(extra)
        self.steps.append(record)
        self.roundtrip_log.write(json.dumps(record) + "\n")
        self.roundtrip_log.flush()
        if status == "FAIL":
            self.failures.append(name)
        note(f"{status} {name} {detail.strip().splitlines()[-1] if detail.strip() else ''}")

    def emit(self, name, value, ref, ratio, unit="GB/s", vs="ceiling", **extra):
        record = {"name": name, "value": round(value, 4), "unit": unit, "vs": vs,
                  "ref": round(ref, 4), "ratio": round(ratio, 3)}
        record.update({k: v for k, v in extra.items() if v is not None})
        line = json.dumps(record)
        print(line, flush=True)
        self.figure_log.write(line + "\n")
        self.figure_log.flush()
        self.figures.append(record)


# --- helpers ----------------------------------------------------------------

def seconds_in(stdout):
    match = re.search(r" in ([0-9.]+) s", stdout)
    return float(match.group(1)) if match else None


def stall_in(stdout):
    match = re.search(r"stall ([0-9.]+) s, total ([0-9.]+) s", stdout)
    return (float(match.group(1)), float(match.group(2))) if match else None


def files_of(directory):
    return sorted(os.path.join(directory, f) for f in os.listdir(directory)
                  if os.path.isfile(os.path.join(directory, f)))


def dir_bytes(directory):
    return sum(os.path.getsize(f) for f in files_of(directory))


D2H_TORCH = r"""
import json, sys, time, torch
n = int(sys.argv[1])
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
dev.fill_(7)
t = time.perf_counter()
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
pin = time.perf_counter() - t
host.copy_(dev, non_blocking=True); torch.cuda.synchronize()  # warm-up, pages touched
times = []
for _ in range(3):
    torch.cuda.synchronize(); t = time.perf_counter()
    host.copy_(dev, non_blocking=True); torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
print(json.dumps({"bytes": n, "seconds": min(times), "all": times, "pin_alloc_seconds": pin,
                  "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}))
"""

MEMCPY = r"""
import ctypes, json, sys, time
n = int(sys.argv[1]); a = bytearray(n); b = bytearray(n)
pa = ctypes.addressof((ctypes.c_char * n).from_buffer(a))
pb = ctypes.addressof((ctypes.c_char * n).from_buffer(b))
ctypes.memset(pa, 1, n); ctypes.memset(pb, 2, n)
times = []
for _ in range(3):
    t = time.perf_counter(); ctypes.memmove(pb, pa, n); times.append(time.perf_counter() - t)
print(json.dumps({"bytes": n, "seconds": min(times), "all": times}))
"""


# --- 1. round trips ---------------------------------------------------------

def roundtrips(r):
    a = r.args
    plans = a.plans
    small, regroup = os.path.join(plans, "small.fsdpplan"), os.path.join(plans, "small-regroup.fsdpplan")
    work = os.path.join(a.workdir, "roundtrip")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    d, d2, da = (os.path.join(work, n) for n in ("ckpt", "resharded", "async"))
    dev = r.device_flags()
    if a.device != "cpu" and not r.has_device:
        r.step("device option", False, "this fsdp-ckpt has no --device option: nothing runs on "
               "device buffers")
        return

    def run(name, *argv, expect_ok=True, after=None):
        rc, out, err, wall = r.ckpt(*argv)
        ok = (rc == 0) == expect_ok
        if ok and after:
            ok, extra = after(out)
            detail = extra
        else:
            detail = out if ok else (out + err + f"\n(exit status {rc}" +
                                     (f", signal {-rc})" if rc < 0 else ")"))
        r.step(name, ok, detail, rc=rc, wall_s=round(wall, 3))
        return rc == 0, out

    saved, _ = run("save --fill 7", "save", "--plan", small, "--dir", d, "--fill", 7, *dev)
    if saved:
        run("load --check 7", "load", "--plan", small, "--dir", d, "--check", 7, *dev)
        run("verify", "verify", d)
        resharded, _ = run("reshard 1->1 into the regrouped layout", "reshard", "--plan", regroup,
                           "--from", d, "--to", d2, *dev)
        if resharded:
            run("load --check 7 (regrouped, resharded copy)", "load", "--plan", regroup, "--dir",
                d2, "--check", 7, *dev)
        run("load --check 7 (regrouped, from the original)", "load", "--plan", regroup, "--dir", d,
            "--check", 7, *dev)
        # The data plane forced for a group of one: NCCL on the GPU; without one, the
        # communicator's (the same path up to the transport).
        plane = "nccl" if a.device == "cuda" else "communicator"
        if not r.has_replica_plane:
            r.step(f"load --replica-plane {plane}", None if a.device != "cuda" else False,
                   "this fsdp-ckpt has no --replica-plane option")
        else:
            run(f"load --check 7 --replica-plane {plane} (world size 1)", "load", "--plan", small,
                "--dir", d, "--check", 7, *dev, "--replica-plane", plane)
    else:
        for name in ("load --check 7", "verify", "reshard 1->1", "load --replica-plane nccl"):
            r.step(name, None, "the save failed")

    def stall_ok(out):
        parsed = stall_in(out)
        if not parsed:
            return False, "no 'stall S s, total T s' in: " + out
        return True, f"stall {parsed[0]:.3f} s, total {parsed[1]:.3f} s"

    ok, _ = run("save --async --fill 9", "save", "--plan", small, "--dir", da, "--fill", 9,
                "--async", *dev, after=stall_ok)
    if ok:
        run("load --check 9 (async save)", "load", "--plan", small, "--dir", da, "--check", 9, *dev)
    ok, _ = run("save --async --overwrite --scribble-after-return 3", "save", "--plan", small,
                "--dir", da, "--fill", 11, "--async", "--overwrite", "--scribble-after-return", 3,
                *dev, after=stall_ok)
    if ok:
        run("load --check 11 (buffers overwritten after the async return)", "load", "--plan",
            small, "--dir", da, "--check", 11, *dev)
    if a.device != "cuda" and r.has_device:
        # Host-only runs (no GPU here): --device cuda must fail with one line naming CUDA.
        rc, out, err, _ = r.ckpt("save", "--plan", small, "--dir", os.path.join(work, "nocuda"),
                                 "--fill", 1, "--device", "cuda")
        lines = err.strip().splitlines()
        r.step("--device cuda refused without CUDA", rc != 0 and len(lines) == 1 and
               "CUDA" in err.upper(), err or out, rc=rc)
    shutil.rmtree(work, ignore_errors=True)


# --- 2. figures -------------------------------------------------------------

def figures(r):
    a = r.args
    plan = os.path.join(a.plans, f"{a.figures_plan}.fsdpplan")
    work = os.path.join(a.workdir, "figures")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    T = a.threads
    dev = r.device_flags()
    if a.device != "cpu" and not r.has_device:
        r.step("figures", False, "this fsdp-ckpt has no --device option")
        return {}
    res = {"threads": T, "device": a.device}
    r.res = res  # partial figures survive a failure further on
    ours = os.path.join(work, "ours")
    base = ["--plan", plan, "--threads", T, *dev]

    # Saves: rounds of our save and the write ceiling (its methods in turn), ours first in
    # even rounds and last in odd ones; a ratio per round, the median and spread reported.
    saves, rounds = [], []
    for number in range(a.save_rounds):
        if saves:
            per_save = median(saves)
            # Leave room for the loads (a cold round of 7 and the warm one), the async saves
            # and DCP.
            reserve = 30 * per_save + (0 if a.no_dcp else 8 * per_save) + 30
            if r.left() < (len(WRITE_METHODS) + 1) * per_save + 10 + reserve:
                note(f"save rounds: stopping after {len(rounds)} (deadline)")
                break
        ceilings = {}

        def ceiling():
            # The best of buffered and direct writes of the same bytes, one writer per file
            # and (direct, preallocated) four.
            for method, direct, per_file, prealloc in WRITE_METHODS:
                try:
                    seconds = write_ceiling(work, res["disk_bytes"], T, direct, per_file,
                                            prealloc)
                except OSError as error:
                    r.step(f"figures: write ceiling ({method})", False, repr(error))
                    continue
                ceilings[method] = round(seconds, 3)

        if number % 2:
            ceiling()
        rc, out, err, _ = r.ckpt("save", "--dir", ours, "--fill", 1, *base,
                                 *(["--overwrite"] if number else []),
                                 "--stats-json", os.path.join(work, "save-stats.json"))
        t = seconds_in(out)
        if rc or t is None:
            r.step(f"figures: save (round {number + 1})", False, f"{out}{err}(exit status {rc})",
                   rc=rc)
            return res
        saves.append(t)
        res["save_s"] = saves
        res["disk_bytes"] = dir_bytes(ours)
        if number % 2 == 0:
            ceiling()
        if ceilings:
            best = min(ceilings, key=ceilings.get)
            rounds.append({"save_s": t, "ceilings_s": ceilings, "ceiling_s": ceilings[best],
                           "ceiling_method": best})
            note(f"save round {number + 1}: ours {t:.3f} s, ceiling {ceilings} s")
    res["save_rounds"] = rounds
    spec = json.loads(subprocess.run([a.ckpt, "inspect", ours, "--json"], check=True,
                                     capture_output=True, text=True).stdout)
    spec_path = os.path.join(work, "spec.json")
    json.dump(spec, open(spec_path, "w"))
    itemsize = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4,
                "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
    res["tensor_bytes"] = sum(itemsize[k["dtype"]] * prod(k["shape"]) for k in spec["keys"]
                              if k["kind"] == "tensor")
    files = files_of(ours)
    data_files = [f for f in files if f.endswith(".distcp")]

    # Cold loads: rounds of the read ceiling then ours and its variants, the
    # cache dropped before each (cold_rounds). Warm: the ceiling after a first
    # read, then ours with --check 1.
    if r.left() < 4 * min(saves) + 20:
        note("skipping the loads (deadline)")
    else:
        cold_rounds(r, res, ours, files, data_files, plan)
    if "load_cold_s" in res and r.left() >= 4 * min(saves) + 20:
        for method in ("warm-up", "buffered"):
            try:
                seconds, res["read_bytes"] = read_ceiling(data_files, T)
            except OSError as error:
                r.step(f"figures: read ceiling (warm, {method})", False, repr(error))
                continue
            if method == "buffered":
                res["ceiling_read_warm_methods"] = {method: round(seconds, 3)}
                res["ceiling_read_warm_s"], res["ceiling_read_warm_method"] = seconds, method
        rc, out, err, _ = r.ckpt("load", "--dir", ours, *base, "--check", 1)
        t = seconds_in(out)
        if rc or t is None:
            r.step("figures: load (warm) --check 1", False, f"{out}{err}(exit status {rc})", rc=rc)
        else:
            r.step("figures: warm load --check 1 (the figures' checkpoint)", True, out)
            res["load_warm_s"] = t
    shutil.rmtree(ours, ignore_errors=True)

    # Async saves: the first, then a repeated one over it, in one process (--repeat 2: the
    # second finds everything reserved and warm, as a training job's later saves do). The
    # snapshot is reserved (and pinned) before the clock, as at a job's start-up.
    target = os.path.join(work, "async")
    if r.left() < 3 * min(saves) + 20:
        note("skipping the async saves (deadline)")
    else:
        rc, out, err, _ = r.ckpt("save", "--dir", target, "--fill", 2, "--async", "--repeat", 2,
                                 *base)
        stalls = re.findall(r"stall ([0-9.]+) s, total ([0-9.]+) s", out)
        if rc or len(stalls) != 2:
            r.step("figures: async saves (first, repeat)", False,
                   f"{out}{err}(exit status {rc})", rc=rc)
        else:
            for label, (stall, total) in zip(("first", "repeat"), stalls):
                res[f"stall_{label}"] = (float(stall), float(total))
    shutil.rmtree(target, ignore_errors=True)

    # The stall's reference: a pinned device-to-host copy of the shard's bytes (host memcpy
    # on the CPU).
    if r.left() > 15:
        script, python = (D2H_TORCH, a.python) if a.device == "cuda" else (MEMCPY, sys.executable)
        out = subprocess.run([python, "-c", script, str(res["tensor_bytes"])], capture_output=True,
                             text=True)
        if out.returncode:
            r.step("figures: pinned D2H copy", False, out.stderr)
        else:
            res["d2h"] = json.loads(out.stdout.strip().splitlines()[-1])

    # PyTorch DCP on the same tensors.
    if a.no_dcp:
        note("DCP baseline skipped (--no-dcp)")
    elif r.left() < 8 * min(saves) + 20:
        note("DCP baseline skipped (deadline)")
        r.step("figures: DCP baseline", None, "skipped: not enough time left")
    else:
        probe = subprocess.run([a.python, "-c", "import torch"], capture_output=True, text=True)
        if probe.returncode:
            note(f"DCP baseline skipped: {a.python} has no torch")
            res["dcp_skipped"] = "no torch"
        else:
            try:
                out = subprocess.run([a.python, os.path.join(HERE, "dcp_baseline.py"), "--spec",
                                      spec_path, "--work", work, "--threads", str(T), "--device",
                                      "cuda" if a.device == "cuda" else "cpu"],
                                     capture_output=True, text=True,
                                     timeout=max(10.0, r.left() - 5))
            except subprocess.TimeoutExpired as expired:  # keep what it measured
                text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
                out = subprocess.CompletedProcess(expired.cmd, 124, text(expired.stdout),
                                                  text(expired.stderr) + "\n(timed out: the "
                                                  "deadline)")
            sys.stderr.write(out.stderr[-3000:])
            dcp = {}
            for line in out.stdout.splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                note("dcp: " + line)
                key = record["name"] + (f"_{record['cache']}" if "cache" in record else "")
                dcp[key] = record
                if record["name"] == "dcp_error":
                    r.step(f"figures: DCP {record['what']}", False, record["error"])
            if out.returncode:
                r.step("figures: DCP baseline", False, out.stderr)
            res["dcp"] = dcp
    shutil.rmtree(work, ignore_errors=True)
    return res


# The ceilings' methods: (name, O_DIRECT, writers per file, preallocated) for
# writes (one file per thread), (name, O_DIRECT, readers per thread, pread
# size) for cold reads. Direct I/O buffers are in huge pages (bench/rawio.py). Four per file or thread keep that many more requests in flight, as
# the runtime's direct writes (8 per file) and reads do.
WRITE_METHODS = (
    ("buffered", False, 1, False),
    ("O_DIRECT", True, 1, False),
    ("O_DIRECT, 4 writers a file, preallocated", True, 4, True),
)
READ_METHODS = (
    ("buffered", False, 1, 64 << 20),
    ("O_DIRECT", True, 1, 64 << 20),
    ("O_DIRECT, 4 x the threads", True, 4, 64 << 20),
    ("O_DIRECT, 8 x the threads, 32 MiB preads", True, 8, 32 << 20),
)


# Other ways to load the same checkpoint cold, in every round beside the
# default: the host path on the same disk (what the device path is up
# against), reads through the page cache instead of direct ones, and
# staging blocks of another size (2 a worker, pinned within the load's time).
COLD_VARIANTS = (
    ("host buffers", ["--device", "cpu"]),
    ("buffered reads", ["--buffered-io"]),
    ("host buffers, buffered reads", ["--device", "cpu", "--buffered-io"]),
    ("8 MiB blocks", ["--staging-mb", "128"]),
)


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def cold_rounds(r, res, ours, files, data_files, plan):
    """Up to --cold-rounds rounds, each: the read ceiling (the first round
    every method of READ_METHODS, later rounds buffered and the fastest
    direct method of the first; the fastest counts), then our cold load and
    each variant in a rotating order, the cache dropped before every read.
    Ratios are taken within a round; the medians and spreads are reported."""
    a = r.args
    T = a.threads
    loads = [("default", [])] + list(COLD_VARIANTS)
    rounds = []
    for number in range(a.cold_rounds):
        if rounds:
            per_load = median([x for rnd in rounds for x in rnd["loads"].values()])
            cost = (len(loads) + 2) * per_load + 10
            # Leave room for the warm load, the async saves and DCP.
            reserve = 12 * per_load + (0 if a.no_dcp else 8 * min(res["save_s"])) + 30
            if r.left() < cost + reserve:
                note(f"cold rounds: stopping after {len(rounds)} (deadline)")
                break
        ceilings = {}
        methods = READ_METHODS
        if rounds:
            first = rounds[0]["ceilings_s"]
            fastest_direct = min((m for m in first if m != "buffered"), key=first.get,
                                 default=None)
            methods = [m for m in READ_METHODS if m[0] in ("buffered", fastest_direct)]
        for method, direct, per_thread, block in methods:
            drop_cache(files)
            try:
                seconds, res["read_bytes"] = read_ceiling(data_files, T * per_thread, direct,
                                                          block)
            except OSError as error:
                r.step(f"figures: read ceiling (cold, {method})", False, repr(error))
                continue
            ceilings[method] = round(seconds, 3)
        if not ceilings:
            return
        timings = {}
        shift = number % len(loads)
        for label, extra in loads[shift:] + loads[:shift]:
            argv = ["--plan", plan, "--threads", T, *r.device_flags()]
            for flag in extra[::2]:  # a variant's flag replaces the base's
                if flag in argv:
                    at = argv.index(flag)
                    del argv[at:at + 2]
            drop_cache(files)
            rc, out, err, _ = r.ckpt("load", "--dir", ours, *argv, *extra)
            t = seconds_in(out)
            if rc or t is None:
                r.step(f"figures: cold load ({label}, round {number + 1})", False,
                       f"{out}{err}(exit status {rc})", rc=rc)
                return
            timings[label] = t
        best = min(ceilings, key=ceilings.get)
        rounds.append({"ceilings_s": ceilings, "ceiling_s": ceilings[best],
                       "ceiling_method": best, "loads": timings})
        note(f"cold round {number + 1}: ceiling {ceilings} s, loads {timings} s")
    if not rounds:
        return
    res["cold_rounds"] = rounds
    res["load_cold_s"] = median([rnd["loads"]["default"] for rnd in rounds])


def prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def report(r, res):
    """The JSON lines, then the summary lines (returned)."""
    if not res or "save_s" not in res:
        return ["figures: none (see the failures above)"]
    T, device = res["threads"], res["device"]
    B = res["disk_bytes"]
    P = res.get("tensor_bytes", B)
    common = dict(threads=T, device=device, bytes=B)
    lines = [f"figures: {P / GB:.2f} GB of tensors ({B / GB:.2f} GB on disk) on 1 rank, "
             f"device {device}, {T} threads (ours and every reference)"]
    save_s = median(res["save_s"])
    dcp = res.get("dcp", {})

    def bar(ok):
        return "met" if ok else "MISSED"

    rounds = res.get("save_rounds", [])
    if rounds:
        ratios = [rnd["ceiling_s"] / rnd["save_s"] for rnd in rounds]
        ours, ceil = median([B / rnd["save_s"] for rnd in rounds]), \
            median([B / rnd["ceiling_s"] for rnd in rounds])
        r.emit("save", ours / GB, ceil / GB, median(ratios), bar=BAR_SAVE_VS_CEILING,
               rounds=len(rounds), ratio_min=round(min(ratios), 3),
               ratio_max=round(max(ratios), 3),
               saves_s=[round(rnd["save_s"], 3) for rnd in rounds],
               ceiling_methods=[rnd["ceiling_method"] for rnd in rounds],
               ceilings_s=[rnd["ceilings_s"] for rnd in rounds], **common)
        lines.append(f"  save {ours / GB:.2f} GB/s vs {T} threads writing+fsyncing the same "
                     f"bytes {ceil / GB:.2f} GB/s = {median(ratios):.2f} x ceiling (median of "
                     f"{len(rounds)} interleaved rounds, {min(ratios):.2f}-{max(ratios):.2f}; "
                     f"bar {BAR_SAVE_VS_CEILING}: {bar(median(ratios) >= BAR_SAVE_VS_CEILING)})")
    if "dcp_save" in dcp:
        t = dcp["dcp_save"]["seconds"]
        r.emit("save", P / save_s / GB, P / t / GB, t / save_s, vs="dcp", threads=T,
               device=device, bytes=P, dcp_thread_count=T)
        lines.append(f"  save vs PyTorch DCP (FileSystemWriter thread_count={T}, 1 process): "
                     f"{P / save_s / GB:.2f} vs {P / t / GB:.2f} GB/s = {t / save_s:.2f} x")
    for cache in ("cold", "warm"):
        key = f"load_{cache}_s"
        if key not in res:
            continue
        t = res[key]
        if f"ceiling_read_{cache}_s" in res:
            ours, ceil = B / t, res["read_bytes"] / res[f"ceiling_read_{cache}_s"]
            is_bar = cache == "cold"
            method = res[f"ceiling_read_{cache}_method"]
            methods = res[f"ceiling_read_{cache}_methods"]
            r.emit("load", ours / GB, ceil / GB, ours / ceil, cache=cache,
                   bar=BAR_LOAD_VS_CEILING if is_bar else None, ceiling_method=method,
                   ceiling_methods_s=methods, **common)
            lines.append(f"  load ({cache}) {ours / GB:.2f} GB/s vs {T} threads reading the files "
                         f"{ceil / GB:.2f} GB/s ({method}, the best of {methods} s) = "
                         f"{ours / ceil:.2f} x ceiling" +
                         (f" (bar {BAR_LOAD_VS_CEILING}: {bar(ours / ceil >= BAR_LOAD_VS_CEILING)})"
                          if is_bar else ""))
        if f"dcp_load_{cache}" in dcp:
            td = dcp[f"dcp_load_{cache}"]["seconds"]
            r.emit("load", P / t / GB, P / td / GB, td / t, vs="dcp", cache=cache,
                   bar=BAR_LOAD_VS_DCP, threads=T, device=device, bytes=P)
            lines.append(f"  load ({cache}) vs PyTorch DCP: {P / t / GB:.2f} vs {P / td / GB:.2f} "
                         f"GB/s = {td / t:.2f} x (bar {BAR_LOAD_VS_DCP}: "
                         f"{bar(td / t >= BAR_LOAD_VS_DCP)}; DCP's values "
                         f"{'round-tripped' if dcp[f'dcp_load_{cache}'].get('roundtrip_ok') else 'DID NOT round-trip'})")
    rounds = res.get("cold_rounds", [])
    labels = [label for label in rounds[0]["loads"]] if rounds else []
    for label in sorted(labels, key=lambda x: x != "default"):
        # Ours over the ceiling of the same round, then the median and spread.
        ratios = [(B / rnd["loads"][label]) / (res["read_bytes"] / rnd["ceiling_s"])
                  for rnd in rounds]
        speeds = [B / rnd["loads"][label] / GB for rnd in rounds]
        ceilings = [res["read_bytes"] / rnd["ceiling_s"] / GB for rnd in rounds]
        flags = " ".join(str(x) for x in dict(COLD_VARIANTS).get(label, []))
        is_default = label == "default"
        r.emit("load", median(speeds), median(ceilings), median(ratios), cache="cold",
               bar=BAR_LOAD_VS_CEILING if is_default else None,
               **({} if is_default else {"variant": flags}), rounds=len(rounds),
               ratio_min=round(min(ratios), 3), ratio_max=round(max(ratios), 3),
               ceiling_methods=[rnd["ceiling_method"] for rnd in rounds],
               ceilings_s=[rnd["ceilings_s"] for rnd in rounds],
               loads_s=[round(rnd["loads"][label], 3) for rnd in rounds], **common)
        what = "load (cold)" if is_default else f"load (cold, {label}: {flags})"
        lines.append(f"  {what} {median(speeds):.2f} GB/s vs {T} threads reading the files "
                     f"{median(ceilings):.2f} GB/s = {median(ratios):.2f} x ceiling (median of "
                     f"{len(rounds)} interleaved rounds, {min(ratios):.2f}-{max(ratios):.2f})" +
                     (f" (bar {BAR_LOAD_VS_CEILING}: "
                      f"{bar(median(ratios) >= BAR_LOAD_VS_CEILING)})" if is_default else ""))
    d2h = res.get("d2h")
    for label in ("first", "repeat"):
        if f"stall_{label}" not in res:
            continue
        stall, total = res[f"stall_{label}"]
        per_gb = stall / (P / GB)
        ok = per_gb <= BAR_STALL_S_PER_GB
        extra = dict(save=label, total_s=round(total, 3), s_per_gb=round(per_gb, 4),
                     bar_s_per_gb=BAR_STALL_S_PER_GB, threads=T, device=device, bytes=P)
        if d2h:
            name = "pinned_d2h" if device == "cuda" else "memcpy"
            r.emit("save_stall", stall, d2h["seconds"], d2h["seconds"] / max(stall, 1e-9),
                   unit="s", vs=name, **extra)
        if "dcp_async_save" in dcp:
            ds = dcp["dcp_async_save"]["stall_seconds"]
            r.emit("save_stall", stall, ds, ds / max(stall, 1e-9), unit="s", vs="dcp", **extra)
        lines.append(f"  async save ({label}): stall {stall:.3f} s = {per_gb:.4f} s/GB (bar "
                     f"{BAR_STALL_S_PER_GB}: {bar(ok)}), total {total:.2f} s" +
                     (f"; {'pinned D2H' if device == 'cuda' else 'memcpy'} of the same "
                      f"bytes {d2h['seconds']:.3f} s "
                      f"({P / d2h['seconds'] / GB:.1f} GB/s)" if d2h else "") +
                     (f"; DCP async_save stall {dcp['dcp_async_save']['stall_seconds']:.2f} s"
                      if "dcp_async_save" in dcp else ""))
    if not dcp:
        lines.append(f"  PyTorch DCP: not measured ({res.get('dcp_skipped', 'see above')})")
    lines.append("  (save: rounds of ours and the same byte count written and fsynced into one "
                 "file a thread, 64 MiB writes, buffered, O_DIRECT, and O_DIRECT with 4 writers "
                 "a preallocated file, the fastest; cold load: rounds of the checkpoint's files "
                 "read by the threads, 64 MiB preads into a buffer each, buffered, O_DIRECT, "
                 "O_DIRECT with 4 x the threads, and with 8 x the threads and 32 MiB preads "
                 "(direct buffers in huge pages), the fastest, then our loads in a rotating "
                 "order, the cache dropped before each; warm: buffered, after a first read; "
                 "times as fsdp-ckpt reports them; DCP: one process, no process group, "
                 "tensors on the same device)")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, help="the fsdp-ckpt binary")
    parser.add_argument("--plans", required=True, help=".gpu-carry/plans (bench/gpu/prepare)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu", "simulated"],
                        help="where fsdp-ckpt's buffers live (simulated: the runtime's test "
                             "device, staged like cuda)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", default="/tmp/fsdp-gpu-bench")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--figures-plan", default="bench")
    parser.add_argument("--deadline", type=float, default=0.0)
    parser.add_argument("--python", default="python3", help="a Python with torch (for DCP, D2H)")
    parser.add_argument("--no-dcp", action="store_true")
    parser.add_argument("--skip-roundtrip", action="store_true")
    parser.add_argument("--skip-figures", action="store_true")
    parser.add_argument("--save-rounds", type=int, default=3,
                        help="interleaved rounds of our save and the write ceiling (fewer when "
                             "the deadline nears)")
    parser.add_argument("--cold-rounds", type=int, default=5,
                        help="interleaved rounds of the read ceiling and our cold loads (fewer "
                             "when the deadline nears)")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    r = Runner(args)
    note(f"fsdp-ckpt options: --device {'yes' if r.has_device else 'NO'}, --replica-plane "
         f"{'yes' if r.has_replica_plane else 'NO'}; deadline in {r.left():.0f} s")
    if not args.skip_roundtrip:
        roundtrips(r)
    r.res = {}
    if not args.skip_figures:
        try:
            figures(r)
        except Exception as error:  # noqa: BLE001: reported; the summary still prints
            r.step("figures", False, repr(error))
    res = r.res
    lines = report(r, res)
    passed = sum(s["status"] == "PASS" for s in r.steps)
    skipped = sum(s["status"] == "SKIP" for s in r.steps)
    lines.insert(0, f"\nsummary (device {args.device}): {passed} passed, {len(r.failures)} failed, "
                    f"{skipped} skipped")
    for s in r.steps:
        last = s["detail"].splitlines()[-1] if s["detail"] else ""
        lines.insert(1 + r.steps.index(s), f"  {s['status']:4} {s['step']}"
                     + (f": {last[:160]}" if s["status"] != "PASS" or "stall" in last else ""))
    text = "\n".join(lines)
    print(text, flush=True)
    with open(os.path.join(args.out, "gpu-summary.txt"), "w") as f:
        f.write(text + "\n")
        for fig in r.figures:
            f.write(json.dumps(fig) + "\n")
    return 1 if r.failures else 0


if __name__ == "__main__":
    sys.exit(main())
