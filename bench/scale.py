#!/usr/bin/env python3
"""Scale benchmark: the DCP metadata of the 126-layer Llama-405B-shaped model
saved from 16,384 ranks, and one rank's planning of a resharding load of it
onto 8,192 ranks, measured without writing any data.

Steps: the model lowered for the saving world (default 16,384 ranks) and for
the loading world (default 8,192); the saving world's `.metadata` emitted by
`fsdp-translate --plan-format=dcp-metadata` (size, seconds, peak RSS); its
committing rank's plan (`--plan-ranks=0`, which carries the `.metadata` and
the chunk index deflated) and its commit's part (`fsdp-bench-plan-load
fill-checksums`: the index with fake checksums filled in, written with the
`.metadata` as a commit writes them); one loading rank's plan; then that rank's planning
of its reads, opened as a load opens a checkpoint: through the chunk index
(bar: < 1 s and < 1 GiB) and through the `.metadata` alone, as for a
checkpoint PyTorch wrote (reported). One JSON line per figure (README.md,
Benchmarks), then a summary.

usage: bench/scale.py [--build DIR] [--from-ranks 16384] [--to-ranks 8192] [--rank R]
"""
import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAN_BAR_S = 1.0
PLAN_BAR_MIB = 1024.0


def run(argv, stdout=subprocess.DEVNULL):
    """Runs argv; (seconds, peak RSS in MiB, stdout text or None)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True)
    out = proc.stdout.read() if stdout == subprocess.PIPE else None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        sys.exit(f"bench: {' '.join(argv)} failed: {err}")
    return seconds, usage.ru_maxrss / 1024.0, out


def emit(name, value, unit, ref, **extra):
    """A time or a size against its bar: ratio = bar / ours (higher is better)."""
    figure = {"name": name, "value": float(f"{value:.6g}"), "unit": unit, "vs": "ceiling",
              "ref": ref, "ratio": float(f"{ref / value:.4g}") if value > 0 else None}
    figure.update(extra)
    print(json.dumps(figure), flush=True)


def report(name, value, unit, **extra):
    """A figure without a bar (reported, not judged)."""
    figure = {"name": name, "value": float(f"{value:.6g}"), "unit": unit, "vs": None,
              "ref": None, "ratio": None}
    figure.update(extra)
    print(json.dumps(figure), flush=True)


def lower(tools, tmp, ranks):
    translate, opt = tools
    model = os.path.join(tmp, f"405b-{ranks}.json")
    lowered = os.path.join(tmp, f"405b-{ranks}.lowered.mlir")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_llama_model.py"),
                    "--preset", "405b", "--mesh", f"dp={ranks}", "-o", model], check=True)
    subprocess.run(f"{translate} --import-model-json {model} | {opt} --fsdp-lower-fully-shard "
                   f"-o {lowered}", shell=True, check=True)
    return lowered


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--from-ranks", type=int, default=16384)
    parser.add_argument("--to-ranks", type=int, default=8192)
    parser.add_argument("--rank", type=int, default=None,
                        help="the loading rank measured (default: the middle one)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--metadata-memory-gib", type=int, default=12,
                        help="address-space limit for planning through the .metadata alone")
    args = parser.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    translate = os.path.join(bin_dir, "fsdp-translate")
    tools = (translate, os.path.join(bin_dir, "fsdp-opt"))
    planner = os.path.join(bin_dir, "fsdp-bench-plan-load")
    rank = args.rank if args.rank is not None else args.to_ranks // 2 + 1
    scale = {"ranks": args.from_ranks, "to_ranks": args.to_ranks}
    with tempfile.TemporaryDirectory(prefix="fsdp-bench-scale-", dir=args.workdir) as tmp:
        saved = lower(tools, tmp, args.from_ranks)
        loading = lower(tools, tmp, args.to_ranks)
        ckpt = os.path.join(tmp, "ckpt")
        os.makedirs(ckpt)
        metadata = os.path.join(tmp, "emitted.metadata")
        t_meta, rss_meta, _ = run([translate, "--emit-checkpoint-plan", saved,
                                   "--plan-format=dcp-metadata", "-o", metadata])
        meta_bytes = os.path.getsize(metadata)
        report("metadata_emit", t_meta, "s", ranks=args.from_ranks, bytes=meta_bytes,
               peak_rss_mib=round(rss_meta))
        # The committing rank's plan carries the chunk index (without
        # checksums); its commit fills in the gathered checksums and writes
        # the index and `.metadata`, which is what this checkpoint holds.
        commit_plan = os.path.join(tmp, "rank-0.fsdpplan")
        t_commit_plan, rss_commit_plan, _ = run([translate, "--emit-checkpoint-plan", saved,
                                                 "--plan-ranks=0", "-o", commit_plan])
        report("commit_rank_plan", t_commit_plan, "s", ranks=args.from_ranks,
               bytes=os.path.getsize(commit_plan), peak_rss_mib=round(rss_commit_plan))
        _, _, out = run([planner, "fill-checksums", commit_plan, "--out-dir", ckpt],
                        stdout=subprocess.PIPE)
        built = json.loads(out.strip().splitlines()[-1])
        report("commit_chunk_index", built["total_seconds"], "s", ranks=args.from_ranks,
               bytes=built["index_bytes"], chunks=built["records"],
               peak_rss_mib=round(built["commit_peak_rss_mib"]))
        # Compared in blocks: this process's peak RSS would otherwise be
        # inherited by the measured children (Linux keeps ru_maxrss across exec).
        if not filecmp.cmp(metadata, os.path.join(ckpt, ".metadata"), shallow=False):
            sys.exit("bench: the committing rank's .metadata differs from the emitted one")
        plan = os.path.join(tmp, f"rank-{rank}.fsdpplan")
        run([translate, "--emit-checkpoint-plan", loading, f"--plan-ranks={rank}", "-o", plan])
        results = {}
        for source in ("auto", "metadata"):
            argv = [planner, "plan", "--dir", ckpt, "--plan", plan, "--rank", str(rank),
                    "--source", source]
            if source == "metadata":
                # Parsing the whole `.metadata` may not fit this machine:
                # bounded, and reported as what it is when it does not.
                argv = ["prlimit", f"--as={args.metadata_memory_gib << 30}"] + argv
            proc = subprocess.run(argv, capture_output=True, text=True)
            lines = proc.stdout.strip().splitlines()
            results[source] = json.loads(lines[-1]) if proc.returncode == 0 and lines else {
                "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
        ours = results["auto"]
        if "error" in ours:
            sys.exit(f"bench: planning through the chunk index failed: {ours['error']}")
        if ours["source"] != "chunk_index":
            sys.exit(f"bench: the load did not use the chunk index: {ours}")
        emit("reshard_plan", ours["seconds"], "s", PLAN_BAR_S, source="chunk_index",
             rank=rank, reads=ours["reads"], overlaps=ours["overlaps"], **scale)
        emit("reshard_plan_rss", ours["peak_rss_mib"], "MiB", PLAN_BAR_MIB, source="chunk_index",
             rank=rank, **scale)
        dcp = results["metadata"]
        if "error" in dcp:
            print(json.dumps({"name": "reshard_plan", "value": None, "unit": "s", "vs": None,
                              "ref": None, "ratio": None, "source": "metadata", "rank": rank,
                              "error": dcp["error"],
                              "memory_limit_gib": args.metadata_memory_gib, **scale}), flush=True)
        else:
            report("reshard_plan", dcp["seconds"], "s", source="metadata", rank=rank,
                   peak_rss_mib=round(dcp["peak_rss_mib"]), **scale)
        print(f"\nsummary: the 405B-shaped model saved from {args.from_ranks:,} ranks, loaded "
              f"onto {args.to_ranks:,} (rank {rank}'s planning):")
        print(f"  .metadata {meta_bytes / 1e6:.0f} MB ({built['records']:,} chunks) emitted in "
              f"{t_meta:.1f} s, peak RSS {rss_meta:.0f} MiB")
        print(f"  the committing rank's plan {os.path.getsize(commit_plan) / 1e6:.0f} MB (the "
              f".metadata and the chunk index deflated) in {t_commit_plan:.1f} s, peak RSS "
              f"{rss_commit_plan:.0f} MiB")
        print(f"  its commit: chunk index {built['index_bytes'] / 1e6:.0f} MB with the "
              f"checksums filled in {built['total_seconds']:.1f} s, peak RSS "
              f"{built['commit_peak_rss_mib']:.0f} MiB (no .metadata parsed)")
        print(f"  planning through the chunk index: {ours['seconds']:.3f} s, peak RSS "
              f"{ours['peak_rss_mib']:.0f} MiB, {ours['reads']} reads, {ours['overlaps']} "
              f"overlaps (bars: < {PLAN_BAR_S:.0f} s, < {PLAN_BAR_MIB:.0f} MiB)")
        if "error" in dcp:
            print(f"  planning through the .metadata alone (PyTorch's form): failed within "
                  f"{args.metadata_memory_gib} GiB: {dcp['error']}")
        else:
            print(f"  planning through the .metadata alone (PyTorch's form): "
                  f"{dcp['seconds']:.1f} s, peak RSS {dcp['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
