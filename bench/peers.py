#!/usr/bin/env python3
"""Peers benchmark: our runtime and the other checkpointers on the same tensors, the same
resources (2 gloo processes, the same writer threads) and the same cache state, interleaved.

Systems (each saves to a new directory, loads cold and loads warm, in turn; each round in an
order of its own, every turn after a pause of SETTLE_SECONDS):
  ours                    fm.Checkpointer over the plan, the job's gloo group as communicator
  ours-buffered           the same checkpointer, loading with direct_reads=False (cold
                          ranges through the page cache, as the peers read)
  dcp                     torch.distributed.checkpoint, FileSystemWriter() as it comes
  dcp-best                FileSystemWriter(thread_count=THREADS, single_file_per_rank=True)
  torch-checkpointing     CheckpointManager, synchronous saver, file_write_max_threads=THREADS
                          (buffered: its O_DIRECT writer fails on files of odd sizes here;
                          it never fsyncs, so the bench fsyncs its files in the timed save)
  bytecheckpoint          ByteCheckpoint 0.0.2 (PyPI; it pins torch<=2.5 but runs on this
                          torch on CPU), framework="fsdp2", its defaults: it saves a model and
                          optimizer, so an FSDP2 module with parameters of our model keys'
                          shapes and Adam's two moments (the same bytes as ours)
Then the async saves (the stall until the call returns, first and repeated): each round,
each system in a job of its own (a fresh pair of processes, its state made, every checkpoint
file dropped from the page cache), three saves, the first making its staging memory; ours
save_async, dcp.async_save (dcp-best's writer), torch-checkpointing's default (asynchronous)
saver with CPU staging, ByteCheckpoint's fast_saving=True.

The peers hold every key of our checkpoint as a Shard(0) DTensor of the same shape and dtype:
the same bytes. Cold: every file of the checkpoint fsynced and dropped from the page cache
(posix_fadvise DONTNEED) before the load; warm: every other file of the bench dropped from
the page cache and every file of the checkpoint read through it before the load. Prints one
JSON line per figure (median over the rounds, with min and max) and a summary. Run with a
Python that has torch and fsdp_mlir (bench/run peers does; it installs ByteCheckpoint beside
the venv and names it in FSDP_BYTECHECKPOINT_DIR).

usage: peers.py PLAN WORKDIR [--threads N] [--rounds N] [--systems a,b,...]
"""
import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cache import drop_cache, warm_cache  # noqa: E402

# Seconds each system's turn waits before it starts.
SETTLE_SECONDS = 2

SYSTEMS = ["ours", "ours-buffered", "dcp", "dcp-best", "torch-checkpointing", "bytecheckpoint"]


def fsync_files(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def files_under(path):
    out = []
    for root, _, names in os.walk(path):
        out += [os.path.join(root, n) for n in names]
    return out


def barrier_time(fn):
    """Seconds from a barrier before `fn` to a barrier after it: the slowest rank's time."""
    dist.barrier()
    start = time.perf_counter()
    result = fn()
    dist.barrier()
    return time.perf_counter() - start, result


def peer_state(metadata, mesh, rank, world):
    """Every tensor key of our checkpoint as a Shard(0) DTensor (0-d ones replicated)."""
    from torch.distributed.tensor import DTensor, Shard
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not hasattr(meta, "chunks"):
            continue
        size = list(meta.size)
        if not size:
            out[key] = torch.zeros((), dtype=meta.properties.dtype)
            continue
        rows = -(-size[0] // world)
        begin, end = min(rank * rows, size[0]), min((rank + 1) * rows, size[0])
        local = torch.ones([end - begin] + size[1:], dtype=meta.properties.dtype)
        out[key] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size(size), stride=torch.empty(size).stride())
    return out


class Ours:
    def __init__(self, plan, threads, direct_reads=True, checkpointer=None):
        import fsdp_mlir as fm
        self.ck = checkpointer
        if self.ck is None:
            self.ck = fm.Checkpointer(plan, comm=dist.group.WORLD)
            self.ck.allocate()
            self.ck.fill(1)
        self.threads, self.direct_reads = threads, direct_reads

    def save(self, path):
        self.ck.save(path, overwrite=True, threads=self.threads)

    def load(self, path):
        self.ck.load(path, threads=self.threads, direct_reads=self.direct_reads)

    def save_async(self, path):
        return self.ck.save_async(path, overwrite=True, threads=self.threads)


class Dcp:
    def __init__(self, state, threads=None):
        self.state, self.threads = state, threads

    def save(self, path):
        import torch.distributed.checkpoint as dcp
        writer = (dcp.FileSystemWriter(path) if self.threads is None else
                  dcp.FileSystemWriter(path, thread_count=self.threads, single_file_per_rank=True))
        dcp.save(self.state, storage_writer=writer)

    def load(self, path):
        import torch.distributed.checkpoint as dcp
        dcp.load(self.state, checkpoint_id=path)

    def save_async(self, path):
        import torch.distributed.checkpoint as dcp
        writer = dcp.FileSystemWriter(path, thread_count=self.threads or 1,
                                      single_file_per_rank=True)
        return dcp.async_save(self.state, storage_writer=writer)


class TorchCheckpointing:
    def __init__(self, state, threads, asynchronous=False):
        from torch_checkpointing.checkpoint_manager import CheckpointManager
        from torch_checkpointing.checkpoint_writer import CheckpointWriterConfig
        from torch_checkpointing.config import (AsyncCheckpointSaverConfig,
                                                SyncCheckpointSaverConfig)
        from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig
        writer = CheckpointWriterConfig(file_write_max_threads=threads)
        save = (AsyncCheckpointSaverConfig(writer_config=writer) if asynchronous
                else SyncCheckpointSaverConfig(writer_config=writer))
        # Its O_DIRECT writer fails here (EINVAL closing a file whose tail is not a whole
        # block): buffered writes, as its fallback would do.
        self.manager = CheckpointManager(CheckpointManager.Config(
            save=save, storage_config=LocalFileSystemStorageConfig(use_direct_io=False)))
        # Its keys are plain names (letters, digits, '-' and '_').
        self.state = {k.replace(".", "__"): v for k, v in state.items()}

    def save(self, path):
        future = self.manager.save(path, self.state)
        if future is not None:
            future.result()
        # It never fsyncs (0.1.1): its save ends with the bytes in the page cache. Ours and
        # DCP's end with them on disk, so the bench fsyncs its files inside the timed window.
        fsync_files(files_under(path))

    def load(self, path):
        self.manager.load(path, into=self.state)

    def save_async(self, path):
        future = self.manager.save(path, self.state)
        # save() returns before its staging copy is done (a thread copies meanwhile, and
        # manager.lock() makes the optimizer wait for it): the stall lasts until the copy is.
        staging = getattr(self.manager, "_staging_future", None)
        if staging is not None:
            staging.result()
        return future


class ByteCheckpoint:
    """ByteCheckpoint saves a framework's model and optimizer, not a dict of tensors: an FSDP2
    module whose parameters have the shapes of our model keys, fully_shard-ed on the same mesh,
    with Adam's two moments for each (the same bytes as our checkpoint's weights and moments)."""

    def __init__(self, state, mesh, asynchronous=False):
        packages = os.environ.get("FSDP_BYTECHECKPOINT_DIR")
        if packages and packages not in sys.path:
            sys.path.append(packages)  # after the venv's: its torch and numpy win
        import bytecheckpoint
        from torch.distributed.fsdp import fully_shard
        self.bcp, self.asynchronous = bytecheckpoint, asynchronous
        # Built on the meta device and sharded before any memory is taken: whole tensors on
        # every rank beside the other systems' state ran this machine out of memory.
        with torch.device("meta"):
            model = torch.nn.Module()
            for i, (key, tensor) in enumerate(sorted(state.items())):
                if key.startswith("model.") and tensor.dim():
                    model.register_parameter(f"p{i}", torch.nn.Parameter(torch.empty(tensor.shape)))
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(1.0)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for parameter in model.parameters():
            parameter.grad = torch.zeros_like(parameter)
        self.optimizer.step()  # creates both moments
        self.optimizer.zero_grad()
        self.model = model

    def save(self, path):
        self.bcp.save(path, {"model": self.model, "optimizer": self.optimizer}, framework="fsdp2",
                      fast_saving=self.asynchronous, global_steps=1,
                      ignore_append_global_steps_to_folder=True)

    def load(self, path):
        self.bcp.load(path, {"model": self.model, "optimizer": self.optimizer}, framework="fsdp2")

    def save_async(self, path):
        self.save(path)  # fast_saving=True returns once the bytes are staged (or written)
        return None


def drop(path):
    if dist.get_rank() == 0:
        drop_cache(files_under(path))
    dist.barrier()


def warm(path, work):
    """Every file of `path` in the page cache, and nothing else of the bench's: with the
    five systems' state in memory, a checkpoint read into a cache full of the others'
    was not all kept (82% of one file was, measured with fincore)."""
    if dist.get_rank() == 0:
        mine = set(files_under(path))
        drop_cache([f for f in files_under(work) if f not in mine])
        warm_cache(sorted(mine))
    dist.barrier()


def worker(rank, world, port, plan, work, threads, rounds, systems, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(threads)
    warnings.simplefilter("ignore")
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed.checkpoint as dcp
    mesh = init_device_mesh("cpu", (world,))
    made = {}
    ours_dir = os.path.join(work, "ours")
    made["ours"] = Ours(plan, threads)
    made["ours"].save(ours_dir)  # its .metadata gives the peers their keys
    state = peer_state(dcp.FileSystemReader(ours_dir).read_metadata(), mesh, rank, world)
    nbytes = torch.tensor([sum(t.to_local().nbytes if hasattr(t, "to_local") else
                               (t.nbytes if rank == 0 else 0) for t in state.values())])
    dist.all_reduce(nbytes)
    errors = {}
    for name in systems:
        try:
            if name == "ours-buffered":  # the same buffers: no second copy in memory
                made[name] = Ours(plan, threads, False, made["ours"].ck)
            elif name == "dcp":
                made[name] = Dcp(state)
            elif name == "dcp-best":
                made[name] = Dcp(state, threads)
            elif name == "torch-checkpointing":
                made[name] = TorchCheckpointing(state, threads)
            elif name == "bytecheckpoint":
                made[name] = ByteCheckpoint(state, mesh)
        except Exception as e:  # not installed, or needs what this machine lacks
            errors[name] = f"{type(e).__name__}: {e}"
    times = {n: {"save": [], "load_cold": [], "load_warm": []} for n in systems if n in made}
    for r in range(rounds):
        # Each round in its own order (the same on every rank), so that no system always
        # follows the same one and meets the machine in its wake; each system's turn starts
        # after a pause for what the last one left running (its threads, the disk's flush).
        # Every save goes to a new directory, as a job's checkpoint manager saves each step.
        order = list(times)
        random.Random(r).shuffle(order)
        for name in order:
            path = os.path.join(work, name)
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            gc.collect()
            time.sleep(SETTLE_SECONDS)
            dist.barrier()
            times[name]["save"].append(barrier_time(lambda: made[name].save(path))[0])
            drop(path)
            times[name]["load_cold"].append(barrier_time(lambda: made[name].load(path))[0])
            warm(path, work)
            times[name]["load_warm"].append(barrier_time(lambda: made[name].load(path))[0])
    if rank == 0:
        out.update(bytes=int(nbytes.item()), times=times, errors=errors)
    dist.destroy_process_group()


ASYNC_SYSTEMS = {"ours": "ours", "dcp-best": "dcp", "torch-checkpointing": "torch-checkpointing",
                 "bytecheckpoint": "bytecheckpoint"}


def async_worker(rank, world, port, plan, work, threads, name, out):
    """One system's async saves in a job of their own: three saves, the first making its
    staging memory. A fresh pair of processes for each, so that every system's first save
    meets the machine as a job's does: memory it has not touched, every checkpoint file
    dropped from the page cache, nothing freed by another system a moment before (a
    process that reuses pages another just gave back fills them at several times the speed
    of pages the machine has not handed out yet)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(threads)
    warnings.simplefilter("ignore")
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed.checkpoint as dcp
    mesh = init_device_mesh("cpu", (world,))
    try:
        if name == "ours":
            system = Ours(plan, threads)
        else:
            state = peer_state(dcp.FileSystemReader(os.path.join(work, "ours")).read_metadata(),
                               mesh, rank, world)
            if name == "dcp-best":
                system = Dcp(state, threads)
            elif name == "torch-checkpointing":
                system = TorchCheckpointing(state, threads, True)
            else:
                system = ByteCheckpoint(state, mesh, asynchronous=True)
    except Exception as e:
        if rank == 0:
            out["error"] = f"{type(e).__name__}: {e}"
        dist.destroy_process_group()
        return
    drop(work)
    time.sleep(SETTLE_SECONDS)
    stalls = []
    for i in range(3):
        path = os.path.join(work, f"{name}-async-{i}")
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        stall, handle = barrier_time(lambda: system.save_async(path))
        if handle is not None:
            (handle.wait if hasattr(handle, "wait") else handle.result)()
        dist.barrier()
        stalls.append(stall)
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    if rank == 0:
        out["stalls"] = stalls
    dist.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan")
    parser.add_argument("work")
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    args = parser.parse_args()
    systems = args.systems.split(",")
    os.makedirs(args.work, exist_ok=True)
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(worker, args=(2, free_port(), args.plan, args.work, args.threads, args.rounds,
                           systems, out), nprocs=2, join=True)
    errors = dict(out["errors"])
    # The async saves: each round, each system in a job of its own, in an order of the
    # round's own.
    stalls = {}
    asynchronous = [n for n in ASYNC_SYSTEMS if n in systems and n not in errors]
    for r in range(args.rounds):
        order = list(asynchronous)
        random.Random(1000 + r).shuffle(order)
        for name in order:
            result = manager.dict()
            mp.spawn(async_worker, args=(2, free_port(), args.plan, args.work, args.threads,
                                         name, result), nprocs=2, join=True)
            if "error" in result:
                errors[f"{ASYNC_SYSTEMS[name]} async"] = result["error"]
                asynchronous.remove(name)
            else:
                stalls.setdefault(ASYNC_SYSTEMS[name], []).append(list(result["stalls"]))
    gb = out["bytes"] / 1e9
    settings = {"ours": f"threads={args.threads}",
                "ours-buffered": f"threads={args.threads}, direct_reads=False", "dcp": "FileSystemWriter() defaults",
                "dcp-best": f"thread_count={args.threads}, single_file_per_rank=True",
                "torch-checkpointing": f"sync saver, file_write_max_threads={args.threads}, "
                                       "use_direct_io=False, fsynced by the bench",
                "bytecheckpoint": "0.0.2, framework=fsdp2, its defaults (an FSDP2 module and "
                                  "Adam holding the same bytes)"}
    summary = [f"peers: {gb:.2f} GB over 2 gloo processes, {args.rounds} interleaved rounds, "
               "medians (min-max) in GB/s"]
    for name, figures in out["times"].items():
        line = f"  {name:20s}"
        for figure, seconds in figures.items():
            rates = [gb / s for s in seconds]
            s = spread(rates)
            print(json.dumps({"name": figure, "system": name, "value": round(s["median"], 3),
                              "min": round(s["min"], 3), "max": round(s["max"], 3),
                              "unit": "GB/s", "rounds": len(rates), "settings": settings[name],
                              "cache": figure.partition("_")[2] or None}), flush=True)
            line += f" {figure} {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
        summary.append(line + f"   [{settings[name]}]")
    for name, runs in stalls.items():
        first = spread([run[0] for run in runs])
        repeated = spread([stall for run in runs for stall in run[1:]])
        print(json.dumps({"name": "save_stall", "system": name,
                          "first_s": round(first["median"], 3),
                          "first_min_s": round(first["min"], 3),
                          "first_max_s": round(first["max"], 3),
                          "repeated_s": round(repeated["median"], 3),
                          "repeated_min_s": round(repeated["min"], 3),
                          "repeated_max_s": round(repeated["max"], 3),
                          "unit": "s", "jobs": len(runs)}), flush=True)
        summary.append(f"  async save stall, {name} ({len(runs)} jobs): first "
                       f"{first['median']:.3f} s ({first['min']:.3f}-{first['max']:.3f}), "
                       f"repeated {repeated['median']:.3f} s ({repeated['min']:.3f}-"
                       f"{repeated['max']:.3f})")
    for name, why in errors.items():
        print(json.dumps({"name": "skipped", "system": name, "why": why}), flush=True)
        summary.append(f"  {name}: not measured ({why})")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
