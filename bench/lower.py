#!/usr/bin/env python3
"""Compiler benchmark: import + lowering of a Llama-405B-shaped model.

For each world size (default 8, 1024, 16384 ranks) it generates the model
description (126 decoder layers, one fully_shard unit each), then measures
`fsdp-translate --import-model-json` + `fsdp-opt --fsdp-lower-fully-shard`
(seconds, and peak RSS of the larger of the two processes), and, up to 1,024
ranks, `--emit-layout-json` (which lists every rank, so it grows with the
world). Prints one JSON line per figure (README.md, Benchmarks): ratios are
ref/ours against the bars (2 s and 1 GiB at 16,384 ranks), higher is better;
a time below the timing resolution prints as 0 with a null ratio.

usage: bench/lower.py [--build DIR] [--ranks 8,1024,16384] [--repeat N]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOWER_BAR_S = 2.0
RSS_BAR_MB = 1024.0
ONE_PLAN_BAR_S = 1.0
ALL_PLANS_BAR_S = 30.0


def run(argv):
    """Runs argv; returns (seconds, peak RSS in MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"bench: {' '.join(argv)} failed: {proc.stderr.read().decode()}")
    return seconds, usage.ru_maxrss / 1024.0


def significant(x, digits):
    """x to `digits` significant digits (not decimal places: a plan timed in
    microseconds must not print as 0)."""
    return float(f"{x:.{digits}g}")


def emit(name, value, unit, ref, ranks, higher_is_better=False):
    """One figure. The ratio is computed from the unrounded value; a time of
    zero (below the timing resolution) has no ratio (null) rather than an
    invented one."""
    figure = {"name": name, "value": significant(value, 6), "unit": unit,
              "vs": "ceiling", "ref": ref}
    if higher_is_better:
        figure["ratio"] = significant(value / ref, 4)
    elif value > 0:
        figure["ratio"] = significant(ref / value, 4)
    else:
        figure["ratio"] = None
        figure["note"] = "below timing resolution"
    figure["ranks"] = ranks
    print(json.dumps(figure), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--ranks", default="8,1024,16384")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per figure; the best is reported")
    parser.add_argument("--all-plans", action="store_true",
                        help="also time every rank's plan (one file per rank)")
    parser.add_argument("--all-plans-max", type=int, default=16384,
                        help="largest world for --all-plans (the 16,384-rank plans "
                             "take about 3 GiB of disk)")
    args = parser.parse_args()
    translate = os.path.join(args.build, "bin", "fsdp-translate")
    opt = os.path.join(args.build, "bin", "fsdp-opt")
    summary = []
    with tempfile.TemporaryDirectory(prefix="fsdp-bench-") as tmp:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            model = os.path.join(tmp, f"405b-{ranks}.json")
            imported = os.path.join(tmp, f"405b-{ranks}.mlir")
            lowered = os.path.join(tmp, f"405b-{ranks}.lowered.mlir")
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_llama_model.py"),
                            "--preset", "405b", "--mesh", f"dp={ranks}", "-o", model],
                           check=True)
            best = None
            for _ in range(args.repeat):
                t_import, rss_import = run([translate, "--import-model-json", model, "-o", imported])
                t_lower, rss_lower = run([opt, imported, "--fsdp-lower-fully-shard", "-o", lowered])
                sample = (t_import + t_lower, max(rss_import, rss_lower), t_import, t_lower)
                best = sample if best is None or sample[0] < best[0] else best
            seconds, rss, t_import, t_lower = best
            emit("lower", seconds, "s", LOWER_BAR_S, ranks)
            emit("lower_rss", rss, "MiB", RSS_BAR_MB, ranks)
            line = (f"{ranks:>6} ranks: import {t_import:.3f} s + lower {t_lower:.3f} s "
                    f"= {seconds:.3f} s, peak RSS {rss:.0f} MiB, lowered IR "
                    f"{os.path.getsize(lowered) / 2**20:.1f} MiB")
            # One rank's plan: the translation's time past parsing the IR.
            t_parse = min(run([opt, lowered, "-o", os.devnull])[0] for _ in range(args.repeat))
            middle = ranks // 2 + 1  # not the committing rank
            plan = os.path.join(tmp, f"405b-{ranks}.rank.fsdpplan")
            t_plan = min(run([translate, "--emit-checkpoint-plan", lowered,
                              f"--plan-ranks={middle}", "-o", plan])[0]
                         for _ in range(args.repeat))
            # Noise can make the difference negative: that is no measurable
            # cost (0, no ratio), not a cost of zero-plus-epsilon.
            t_one = max(t_plan - t_parse, 0.0)
            emit("plan", t_one, "s", ONE_PLAN_BAR_S, ranks)
            line += (f", one rank's plan {t_one:.3g} s past parsing "
                     f"({os.path.getsize(plan) / 2**10:.0f} KiB)")
            if args.all_plans and ranks <= args.all_plans_max:
                split = os.path.join(tmp, f"405b-{ranks}.plans")
                t_all, _ = run([translate, "--emit-checkpoint-plan", lowered,
                                f"--plan-split-dir={split}"])
                size = sum(os.path.getsize(os.path.join(split, f)) for f in os.listdir(split))
                emit("plan_all", t_all, "s", ALL_PLANS_BAR_S, ranks)
                line += f", all plans {t_all:.2f} s ({size / 2**30:.2f} GiB)"
                subprocess.run(["rm", "-rf", split], check=True)
            if ranks <= 1024:
                layout = os.path.join(tmp, f"405b-{ranks}.layout.json")
                t_json = min(run([translate, "--emit-layout-json", lowered, "-o", layout])[0]
                             for _ in range(args.repeat))
                emit("layout_json", t_json, "s", LOWER_BAR_S, ranks)
                line += (f", layout JSON {t_json:.3f} s, "
                         f"{os.path.getsize(layout) / 2**20:.1f} MiB")
            summary.append(line)
    print("\nsummary (bars at 16,384 ranks: lowering < 2 s and < 1 GiB; one rank's "
          "plan < 1 s more; all plans < 30 s):")
    for line in summary:
        print("  " + line)


if __name__ == "__main__":
    main()
