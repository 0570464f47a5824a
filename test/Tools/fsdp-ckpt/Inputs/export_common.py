"""What an export of a `--fill SEED` checkpoint must hold (docs/TestValues.md), with torch."""
import json
import os

import numpy as np
import torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def fnv1a32(text):
    h = 2166136261
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def expected(key, shape, seed):
    """The float32 test values of checkpoint key `key`."""
    count = int(np.prod(shape)) if shape else 1
    index = np.arange(count, dtype=np.uint64)
    n = (index * np.uint64(7919) + np.uint64(seed * 104729) + np.uint64(fnv1a32(key))) % np.uint64(65521)
    values = (n.astype(np.int64) - 32760).astype(np.float32) / np.float32(256)
    return torch.from_numpy(values).reshape(shape)


def tied_sources(model_json):
    """FQN -> the FQN whose values a tied set holds (its first), from the model description."""
    model = json.load(open(model_json))
    out = {}

    def walk(module, prefix):
        name = module.get("name", "")
        path = f"{prefix}.{name}" if prefix and name else (name or prefix)
        for p in module.get("params", []):
            fqn = f"{path}.{p['name']}" if path else p["name"]
            out[fqn] = p.get("tied_to", fqn)
        for child in module.get("children", []):
            walk(child, path)

    walk(model["module"], "")
    return out


def load_export(out_dir):
    """Every tensor of an export, through the safetensors package, and the files read."""
    from safetensors import safe_open
    index = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        weight_map = json.load(open(index))["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = None, ["model.safetensors"]
    tensors = {}
    for name in files:
        with safe_open(os.path.join(out_dir, name), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}, f.metadata()
            for key in f.keys():
                assert key not in tensors, key
                tensors[key] = f.get_tensor(key)
                if weight_map is not None:
                    assert weight_map[key] == name, (key, weight_map[key], name)
    if weight_map is not None:
        assert set(weight_map) == set(tensors), set(weight_map) ^ set(tensors)
    return tensors, files
