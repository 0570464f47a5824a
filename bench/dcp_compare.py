#!/usr/bin/env python3
"""PyTorch DCP on the same tensors (CPU, gloo, 2 processes), and PyTorch
reading our checkpoint.

Given a checkpoint fsdp-ckpt saved with `--fill SEED`, this script (run with
a Python that has torch):
  1. reads its `.metadata` with torch's own FileSystemReader;
  2. in 2 gloo processes, builds the same tensors as Shard(0) DTensors
     (every tensor key of the checkpoint, same shapes and dtypes), times
     `dcp.save` (FileSystemWriter, fsync) and `dcp.load` of that state;
  3. `dcp.load`s OUR checkpoint into those DTensors and checks sampled
     elements of every key against the test values of SEED
     (docs/TestValues.md).
Prints one JSON line per figure (rank 0).

usage: python dcp_compare.py OUR_CHECKPOINT SEED WORKDIR [WRITER_THREADS]
"""
import json
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test", "Runtime"))
import test_values  # noqa: E402  (docs/TestValues.md, standard library only)


def state_dict(metadata, mesh, rank, world):
    """Every tensor key as a Shard(0) DTensor (0-d tensors replicated)."""
    out = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not hasattr(meta, "chunks"):
            continue
        size = list(meta.size)
        dtype = meta.properties.dtype
        if not size:
            out[key] = torch.zeros((), dtype=dtype)
            continue
        rows = -(-size[0] // world)
        begin = min(rank * rows, size[0])
        end = min(begin + rows, size[0])
        local = torch.zeros([end - begin] + size[1:], dtype=dtype)
        out[key] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size(size), stride=torch.empty(size).stride())
    return out


def worker(rank, world, ours, seed, work, results, threads):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    metadata = dcp.FileSystemReader(ours).read_metadata()
    state = state_dict(metadata, mesh, rank, world)
    nbytes = sum(t.to_local().nbytes if isinstance(t, DTensor) else (t.nbytes if rank == 0 else 0)
                 for t in state.values())
    total = torch.tensor([nbytes], dtype=torch.int64)
    dist.all_reduce(total)
    target = os.path.join(work, "dcp")
    if rank == 0:
        shutil.rmtree(target, ignore_errors=True)
    dist.barrier()
    t = time.perf_counter()
    # Its best setting for the same resources: as many writer threads as ours.
    dcp.save(state, storage_writer=dcp.FileSystemWriter(target, thread_count=threads))
    dist.barrier()
    save_s = time.perf_counter() - t
    t = time.perf_counter()
    dcp.load(state, checkpoint_id=target)
    dist.barrier()
    load_s = time.perf_counter() - t
    # PyTorch reads our checkpoint: every key, sampled elements checked.
    t = time.perf_counter()
    dcp.load(state, checkpoint_id=ours)
    dist.barrier()
    ours_load_s = time.perf_counter() - t
    checked = 0
    for key, tensor in state.items():
        if not isinstance(tensor, DTensor) or key.startswith("optimizer.state") and key.endswith(".step"):
            continue
        local = tensor.to_local()
        if local.numel() == 0:
            continue
        rows = -(-tensor.shape[0] // world)
        row_size = local[0].numel() if local.dim() > 1 else 1
        first = min(rank * rows, tensor.shape[0]) * row_size
        flat = local.flatten()
        for i in sorted({0, flat.numel() // 2, flat.numel() - 1}):
            want = test_values.values(key, first + i, 1, seed, "float32")[0]
            got = flat[i].item()
            if got != want:
                raise SystemExit(f"rank {rank}: {key} element {first + i}: torch read {got}, "
                                 f"expected {want}")
            checked += 1
    counts = torch.tensor([checked], dtype=torch.int64)
    dist.all_reduce(counts)
    if rank == 0:
        results.update(bytes=int(total.item()), save_s=save_s, load_s=load_s,
                       ours_load_s=ours_load_s, checked=int(counts.item()),
                       keys=len(metadata.state_dict_metadata))
    dist.destroy_process_group()


def main():
    ours, seed, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(worker, args=(2, ours, seed, work, results, threads), nprocs=2, join=True)
    gb = results["bytes"] / 1e9
    for name, seconds in (("dcp_save", results["save_s"]), ("dcp_load", results["load_s"]),
                          ("torch_loads_ours", results["ours_load_s"])):
        print(json.dumps({"name": name, "value": round(gb / seconds, 3), "unit": "GB/s",
                          "bytes": results["bytes"]}), flush=True)
    print(json.dumps({"name": "torch_read_check", "keys": results["keys"],
                      "elements_checked": results["checked"]}), flush=True)


if __name__ == "__main__":
    main()
