"""An export of a PyTorch-written checkpoint holds what PyTorch reads back from it.

usage: check_fixture_export.py EXPORT_DIR VALUES_JSON   (the fixture's values.json)
"""
import json
import sys

import torch
from export_common import load_export

tensors, files = load_export(sys.argv[1])
values = json.load(open(sys.argv[2]))
want = {key[len("model."):]: entry for key, entry in values["values"].items()
        if key.startswith("model.") and "values" in entry}
assert set(tensors) == set(want), set(tensors) ^ set(want)
for name, tensor in tensors.items():
    entry = want[name]
    assert list(tensor.shape) == entry["shape"], (name, tensor.shape, entry["shape"])
    expect = torch.tensor(entry["values"], dtype=getattr(torch, entry["dtype"].split(".")[-1]))
    assert torch.equal(tensor.flatten(), expect), name
print(f"{len(tensors)} tensors, every value as PyTorch reads it")
