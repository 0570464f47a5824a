#!/usr/bin/env python3
"""Loads a planned DCP .metadata with CPython's pickle (torch stand-ins at the
module paths docs/CheckpointFormat.md names, no torch needed) and checks it:
every key docs/CheckpointFormat.md names is there, every tensor's chunks tile it exactly
(no overlap, full volume), every chunk has a storage_data entry with the same
offsets, and every hyper-parameter is a bytes item.

usage: check_plan_metadata.py METADATA
"""
import importlib.util
import itertools
import math
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "..", "..", "..", "Format", "metadata_python_check.py")
spec = importlib.util.spec_from_file_location("standins", STANDINS)
standins = importlib.util.module_from_spec(spec)
spec.loader.exec_module(standins)  # installs the torch.* stand-in modules

# torch's param-group keys, in its order, by optimizer (SGD's has a momentum).
HYPER = {"adam": ["lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach",
                  "capturable", "differentiable", "fused", "decoupled_weight_decay", "params"],
         "sgd": ["lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize",
                 "foreach", "differentiable", "fused", "params"]}


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def main(path):
    with open(path, "rb") as f:
        md = pickle.load(f)
    sdm = md.state_dict_metadata
    tensors = {k: v for k, v in sdm.items() if hasattr(v, "chunks")}
    storage = {(i.fqn, tuple(getattr(i, "offset", None) or ())): info
               for i, info in md.storage_data.items()}
    for key, meta in tensors.items():
        size = tuple(meta.size)
        volume = 0
        boxes = []
        for chunk in meta.chunks:
            off, sz = tuple(chunk.offsets), tuple(chunk.sizes)
            if len(off) != len(size) or len(sz) != len(size):
                fail(f"{key}: chunk rank differs from the tensor's")
            for o, s, d in zip(off, sz, size):
                if o < 0 or s < 0 or o + s > d:
                    fail(f"{key}: chunk {off}/{sz} outside {size}")
            volume += math.prod(sz)
            boxes.append((off, sz))
            if (key, off) not in storage:
                fail(f"{key}: chunk at {off} has no storage_data entry")
        for (a_off, a_sz), (b_off, b_sz) in itertools.combinations(boxes, 2):
            if all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in
                   zip(a_off, a_sz, b_off, b_sz)):
                fail(f"{key}: chunks {a_off} and {b_off} overlap")
        if volume != math.prod(size):
            fail(f"{key}: chunks cover {volume} of {math.prod(size)} elements")
    # Every parameter with optimizer state has the same state names and a model key.
    states = {}
    for key in tensors:
        if key.startswith("optimizer.state."):
            fqn, _, name = key[len("optimizer.state."):].rpartition(".")
            states.setdefault(fqn, set()).add(name)
    params = set(states)
    names = set().union(*states.values()) if states else set()
    for fqn, mine in states.items():
        if mine != names:
            fail(f"optimizer.state.{fqn} has {sorted(mine)}, others {sorted(names)}")
        if f"model.{fqn}" not in tensors:
            fail(f"model.{fqn} missing")
    kind = "sgd" if "optimizer.param_groups.0.momentum" in sdm else "adam"
    if any(k.startswith("optimizer.param_groups.0.") for k in sdm):
        for name in HYPER[kind]:
            key = f"optimizer.param_groups.0.{name}"
            if key not in sdm or hasattr(sdm[key], "chunks"):
                fail(f"{key} missing or not a bytes item")
            if (key, ()) not in storage:
                fail(f"{key} has no storage_data entry")
    files = sorted({info.relative_path for info in md.storage_data.values()})
    chunks = sum(len(m.chunks) for m in tensors.values())
    print(f"OK: {len(sdm)} keys, {len(tensors)} tensors, {chunks} chunks, "
          f"{len(params)} optimizer params, files {' '.join(files)}")
    if names:
        print(f"STATE: {kind} {' '.join(sorted(names))}")


if __name__ == "__main__":
    main(sys.argv[1])
