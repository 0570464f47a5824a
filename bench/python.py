#!/usr/bin/env python3
"""The Python path's save and load (fsdp_mlir.torch.save_checkpoint / load_checkpoint on a
packed torch model, 2 gloo processes) against the C++ tool on the same plan and bytes
(`mpirun -np 2 fsdp-ckpt save/load`: the overhead of the bindings) and against PyTorch DCP
(`dcp.save` / `dcp.load` with FileSystemWriter(thread_count=THREADS)) of the same torch
tensors (the packed parameters and Adam moments as uneven DTensors, steps and the 12
hyper-parameters). Loads are warm (each right after its save). Every load is checked against
the test values (docs/TestValues.md) outside the clock.

Prints one JSON line per figure (README.md, Benchmarks): `vs` "fsdp-ckpt" (the C++ tool's own reported
time, process start-up excluded) or "dcp", ratio = ours / ref in GB/s, then a summary.
Run it with a Python that has torch and fsdp_mlir (scripts/python-tests.sh's venv):

  python bench/python.py [--build DIR] [--model JSON] [--ranks N] [--threads T]
                         [--repeat R] [--workdir DIR]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
SEED = 5


def module_from_description(desc):
    """An nn.Module tree with the description's parameters (meta-free, zero-initialised)."""
    import torch
    from torch_packing import SHORT

    def build(node):
        m = torch.nn.Module()
        for p in node.get("params", []):
            if "tied_to" in p:
                continue
            t = torch.zeros(p["shape"], dtype=SHORT[p["dtype"]])
            m.register_parameter(p["name"], torch.nn.Parameter(
                t, requires_grad=p.get("requires_grad", True)))
        for c in node.get("children", []):
            m.add_module(c["name"], build(c))
        return m

    root = build(desc["module"])

    def tie(node, prefix):
        for p in node.get("params", []):
            if "tied_to" in p:
                mod = root.get_submodule(prefix) if prefix else root
                target = root.get_parameter(p["tied_to"])
                mod.register_parameter(p["name"], target)
        for c in node.get("children", []):
            tie(c, f"{prefix}.{c['name']}" if prefix else c["name"])

    tie(desc["module"], "")
    return root


def worker(rank, world, port, plan, layout, desc, work, threads, repeat, results):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    import torch_packing as tp
    from fsdp_mlir import torch as fmt

    mesh = init_device_mesh("cpu", (world,))
    opt_desc = desc.get("optimizer", {})
    packed = tp.pack(module_from_description(desc), layout, rank, mesh=mesh,
                     optimizer=opt_desc.get("kind", "adamw"), lr=opt_desc.get("lr", 1e-3))
    tp.fill(packed, SEED)
    for st in packed.optimizer.state.values():
        st["step"] = torch.tensor(1.0)
    packed.attach(plan, comm=dist.group.WORLD)
    ck = fmt.attached(packed.model).checkpointer

    def timed(fn):
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        s = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
        dist.all_reduce(s, op=dist.ReduceOp.MAX)
        return float(s)

    ours = os.path.join(work, "py")
    saves, loads = [], []
    for _ in range(repeat):
        saves.append(timed(lambda: fmt.save_checkpoint(packed.model, packed.optimizer, ours,
                                                       threads=threads)))
        for t in packed.buffers.values():
            t.zero_()
        loads.append(timed(lambda: fmt.load_checkpoint(packed.model, packed.optimizer, ours,
                                                       threads=threads)))
        ck.check(SEED)
        tp.check(packed, SEED)

    # PyTorch DCP on the same tensors: the packed views as uneven DTensors.
    state = {}
    for fqn, p in packed.model.named_parameters(remove_duplicate=False):
        state[f"model.{fqn}"] = p
    trainable = []
    for g in layout["groups"]:
        if not g["requires_grad"]:
            continue
        for q in g["params"]:
            st = packed.optimizer.state[packed.model.get_parameter(q["fqn"])]
            trainable.append(q["fqn"])
            for name in ("exp_avg", "exp_avg_sq", "step"):
                state[f"optimizer.state.{q['fqn']}.{name}"] = st[name]
    group = packed.optimizer.param_groups[0]
    for name, value in group.items():
        if name != "params":
            state[f"optimizer.param_groups.0.{name}"] = value
    state["optimizer.param_groups.0.params"] = trainable
    theirs = os.path.join(work, "dcp")
    dsaves, dloads = [], []
    for _ in range(repeat):
        if rank == 0:
            shutil.rmtree(theirs, ignore_errors=True)
        dist.barrier()
        dsaves.append(timed(lambda: dcp.save(
            state, storage_writer=dcp.FileSystemWriter(theirs, thread_count=threads))))
        for t in packed.buffers.values():
            t.zero_()
        dloads.append(timed(lambda: dcp.load(
            state, storage_reader=dcp.FileSystemReader(theirs))))
        tp.check(packed, SEED, model_weight=False)
    if rank == 0:
        results.update(save=saves, load=loads, dcp_save=dsaves, dcp_load=dloads)


def reported_seconds(argv):
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"bench: {' '.join(argv)} failed: {out.stderr[-2000:]}")
    match = re.search(r" in ([0-9.]+) s", out.stdout)
    if not match:
        sys.exit(f"bench: no time in the output of {' '.join(argv)}: {out.stdout}")
    return float(match.group(1))


def data_bytes(ckdir):
    """The planned data files' bytes (the live items' file, which only the Python path writes:
    the optimizer's param groups as they are, is left out)."""
    return sum(os.path.getsize(os.path.join(ckdir, f)) for f in os.listdir(ckdir)
               if f.endswith(".distcp") and not f.startswith("__live_"))


def emit(name, value, ref, vs, **extra):
    record = {"name": name, "value": round(value, 3), "unit": "GB/s", "vs": vs,
              "ref": round(ref, 3), "ratio": round(value / ref, 3)}
    record.update(extra)
    print(json.dumps(record), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.environ.get("FSDP_BUILD_DIR",
                                                      os.path.join(ROOT, "build")))
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "llama-tiny.json"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    os.environ.setdefault("FSDP_MLIR_BIN_DIR", os.path.join(args.build, "bin"))
    os.environ.setdefault("FSDP_MLIR_TOOLS", os.path.join(args.build, "bin"))
    import torch.multiprocessing as mp

    import torch_packing as tp

    work = args.workdir or tempfile.mkdtemp(prefix="fsdp-bench-python-")
    os.makedirs(work, exist_ok=True)
    with open(args.model) as f:
        desc = json.load(f)
    plan, layout = tp.compile_model(args.model, os.path.join(work, "plan"),
                                    mesh=f"dp={args.ranks}", placements="shard")
    ckpt = os.path.join(args.build, "bin", "fsdp-ckpt")

    # The C++ tool on the same plan: its own reported seconds (slowest rank).
    cdir = os.path.join(work, "cpp")
    csaves, cloads = [], []
    for _ in range(args.repeat):
        csaves.append(reported_seconds(MPIRUN + ["-np", str(args.ranks), ckpt, "save", "--plan",
                                                 plan, "--dir", cdir, "--fill", str(SEED),
                                                 "--overwrite", "--threads",
                                                 str(args.threads)]))
        cloads.append(reported_seconds(MPIRUN + ["-np", str(args.ranks), ckpt, "load", "--plan",
                                                 plan, "--dir", cdir, "--check", str(SEED),
                                                 "--threads", str(args.threads)]))
    nbytes = data_bytes(cdir)

    manager = mp.Manager()
    results = manager.dict()
    port = tp.free_port()
    mp.spawn(tp._entry, args=(worker, args.ranks, port,
                              (plan, layout, desc, work, args.threads, args.repeat, results)),
             nprocs=args.ranks, join=True)
    if data_bytes(os.path.join(work, "py")) != nbytes:
        sys.exit("bench: the Python path wrote other bytes than the C++ tool")
    gb = nbytes / 1e9
    best = {k: min(v) for k, v in results.items()}
    best.update(cpp_save=min(csaves), cpp_load=min(cloads))
    common = {"bytes": nbytes, "ranks": args.ranks, "threads": args.threads,
              "repeat": args.repeat, "model": os.path.basename(args.model)}
    emit("save", gb / best["save"], gb / best["cpp_save"], "fsdp-ckpt", path="python", **common)
    emit("load", gb / best["load"], gb / best["cpp_load"], "fsdp-ckpt", path="python",
         cache="warm", **common)
    emit("save", gb / best["save"], gb / best["dcp_save"], "dcp", path="python",
         dcp_thread_count=args.threads, **common)
    emit("load", gb / best["load"], gb / best["dcp_load"], "dcp", path="python", cache="warm",
         dcp_thread_count=args.threads, **common)
    print(f"python path, {args.ranks} ranks, {nbytes / 1e6:.1f} MB, {args.threads} thread(s), "
          f"best of {args.repeat}: save {best['save']:.3f} s (fsdp-ckpt {best['cpp_save']:.3f} s,"
          f" dcp {best['dcp_save']:.3f} s), load {best['load']:.3f} s (fsdp-ckpt "
          f"{best['cpp_load']:.3f} s, dcp {best['dcp_load']:.3f} s); medians: save "
          f"{statistics.median(results['save']):.3f} s, load "
          f"{statistics.median(results['load']):.3f} s")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
