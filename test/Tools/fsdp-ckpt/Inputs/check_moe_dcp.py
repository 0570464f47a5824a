#!/usr/bin/env python3
"""PyTorch DCP loads an MoE checkpoint of ours into whole tensors.

  check_moe_dcp.py CHECKPOINT EXPERTS SEED

Every tensor key of the checkpoint's `.metadata` is loaded with
`dcp.load(no_dist=True)` into a zero tensor of its full shape, and every
element must equal `fsdp-ckpt save --fill SEED`'s value (docs/TestValues.md).
The experts' keys must be exactly the global experts 0 .. EXPERTS-1 of
moe_model.py, each once, whatever expert-parallel size saved them.
"""
import os
import re
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "Runtime"))
import test_values  # noqa: E402


def main():
    ckdir, experts, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    metadata = dcp.FileSystemReader(ckdir).read_metadata()
    state = {}
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            state[key] = torch.zeros(list(entry.size), dtype=entry.properties.dtype)
    dcp.load(state, checkpoint_id=ckdir, no_dist=True)

    # One key per global expert and parameter, for the weights and for each
    # of AdamW's moments.
    pattern = re.compile(r"^(model|optimizer\.state)\.mlp\.experts\.(.*)$")
    found = {}
    for key in state:
        match = pattern.match(key)
        if match:
            found.setdefault(match.group(1), []).append(match.group(2))
    for prefix in ("model", "optimizer.state"):
        names = sorted(found.get(prefix, []))
        # The expert number: local_experts.<g>. or a weight<g> component.
        number = re.compile(r"(?<=^local_experts\.)\d+(?=\.)|(?<=weight)\d+(?=$|\.)")
        stems = sorted({number.sub("<g>", name, count=1) for name in names})
        want = sorted(s.replace("<g>", str(g), 1) for s in stems for g in range(experts))
        if names != want or not names:
            sys.exit(f"{prefix}: expert keys {names} are not experts 0..{experts - 1} once each")

    checked = 0
    for key, tensor in state.items():
        if key.endswith(".step"):
            continue  # a step holds the step count, not a test value
        flat = tensor.flatten()
        want = test_values.values(key, 0, flat.numel(), seed)
        got = flat.tolist()
        for index, (a, b) in enumerate(zip(got, want)):
            if a != b:
                sys.exit(f"{key} element {index}: torch read {a}, expected {b}")
        checked += flat.numel()
    experts_keys = len(found["model"])
    print(f"OK: {experts_keys} expert weights (experts 0..{experts - 1} once each), "
          f"{checked} elements of {len(state)} tensors equal --fill {seed}")


if __name__ == "__main__":
    main()
