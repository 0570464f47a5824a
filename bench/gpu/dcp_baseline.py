#!/usr/bin/env python3
"""PyTorch DCP baseline for bench/gpu/run: torch.distributed.checkpoint on the
same bytes as our checkpoint, one process, tensors on the GPU (or the CPU).

Given a key spec (bench/gpu/gpu_bench.py writes it from `fsdp-ckpt inspect
--json` of our checkpoint: every tensor key with its shape and PyTorch dtype
name), it builds one tensor per key on DEVICE (filled with non-zero values),
then times, with FileSystemWriter(thread_count=THREADS) (files fsynced, its
default):
  save          dcp.save of the state (synchronized before and after);
  load cold     dcp.load into the same tensors after posix_fadvise(DONTNEED)
                on every file it wrote (the state our cold load starts from);
  load warm     dcp.load again, right after;
  async stall   dcp.async_save: the time until the caller may change the
                tensors (async_save's return, and its staging completion where
                it returns one), and the total time until the write is done.
A sample of the loaded values is compared with what was saved (the tensors are
refilled between the save and the loads).

No process group: DCP's own single-process mode (the same resources as our one
rank). Prints one JSON object per line: {"name": "dcp_save", "seconds", "bytes",
...}, {"name": "dcp_error", "what", "error"} for a step that failed.

usage: dcp_baseline.py --spec SPEC.json --work DIR [--threads 8] [--device cuda]
                       [--no-async]
"""
import argparse
import inspect
import json
import os
import shutil
import sys
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

DTYPES = {
    "float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16,
    "float16": torch.float16, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}


def emit(**record):
    print(json.dumps(record), flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_state(spec, device):
    """One tensor per tensor key of the spec, filled with non-zero values."""
    state = {}
    for key in spec["keys"]:
        if key.get("kind", "tensor") != "tensor":
            continue
        dtype = DTYPES[key["dtype"]]
        tensor = torch.empty(key["shape"], dtype=dtype, device=device)
        fill(tensor, 1)
        state[key["key"]] = tensor
    return state


def fill(tensor, seed):
    if tensor.is_floating_point():
        flat = tensor.view(-1)
        flat.fill_(0.5 + seed / 256)
        if flat.numel() > 1:
            flat[::997].fill_(-1.25 * seed)
    else:
        tensor.fill_(seed % 2 if tensor.dtype == torch.bool else seed)


def drop_cache(directory):
    """Evicts the files' pages (fsynced first, so they are clean)."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def samples(state):
    """A few elements of every tensor, on the host, for the round-trip check."""
    out = {}
    for key, tensor in state.items():
        flat = tensor.view(-1)
        idx = [0, flat.numel() // 2, flat.numel() - 1] if flat.numel() else []
        out[key] = [flat[i].item() for i in idx]
    return out


def single_process(function):
    """no_dist=True where this DCP takes it (single-process mode without a process group;
    DCP falls back to it by itself otherwise, with a warning)."""
    try:
        return {"no_dist": True} if "no_dist" in inspect.signature(function).parameters else {}
    except (TypeError, ValueError):
        return {}


def timed(device, fn):
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-async", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # DCP warns that no process group is initialized
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.init()
    spec = json.load(open(args.spec))
    state = build_state(spec, device)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    emit(name="dcp_env", torch=torch.__version__, device=str(device),
         gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
         keys=len(state), bytes=nbytes, threads=args.threads)
    expected = samples(state)
    target = os.path.join(args.work, "dcp")
    shutil.rmtree(target, ignore_errors=True)
    common = dict(bytes=nbytes, threads=args.threads, device=str(device))
    saved = False
    try:
        seconds = timed(device, lambda: dcp.save(
            state, storage_writer=dcp.FileSystemWriter(target, thread_count=args.threads),
            **single_process(dcp.save)))
        disk = sum(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target))
        emit(name="dcp_save", seconds=seconds, disk_bytes=disk, **common)
        saved = True
    except Exception as error:  # noqa: BLE001: reported, the other figures still run
        emit(name="dcp_error", what="save", error=repr(error)[:800])
    if saved:
        for cache in ("cold", "warm"):
            try:
                for tensor in state.values():
                    fill(tensor, 3)
                if cache == "cold":
                    drop_cache(target)
                seconds = timed(device, lambda: dcp.load(
                    state, storage_reader=dcp.FileSystemReader(target),
                    **single_process(dcp.load)))
                ok = samples(state) == expected
                emit(name="dcp_load", cache=cache, seconds=seconds, roundtrip_ok=ok, **common)
            except Exception as error:  # noqa: BLE001
                emit(name="dcp_error", what=f"load_{cache}", error=repr(error)[:800])
    shutil.rmtree(target, ignore_errors=True)
    if not args.no_async:
        target = os.path.join(args.work, "dcp-async")
        shutil.rmtree(target, ignore_errors=True)
        try:
            sync(device)
            start = time.perf_counter()
            response = dcp.async_save(
                state, storage_writer=dcp.FileSystemWriter(target, thread_count=args.threads),
                **single_process(dcp.async_save))
            # Newer DCP may stage in the background too: the caller may change the tensors
            # only once the staging completes.
            staging = getattr(response, "staging_completion", None)
            if staging is not None:
                staging.result()
            stall = time.perf_counter() - start
            upload = getattr(response, "upload_completion", response)
            upload.result()
            total = time.perf_counter() - start
            emit(name="dcp_async_save", stall_seconds=stall, total_seconds=total, **common)
        except Exception as error:  # noqa: BLE001
            emit(name="dcp_error", what="async_save", error=repr(error)[:800])
        shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
