"""Reads an export with the `safetensors` package and checks every value.

usage: check_export.py OUT_DIR MODEL_JSON SEED DTYPE [MIN_FILES]

Every parameter of MODEL_JSON is there under its FQN, with the test values of
its checkpoint key `model.<fqn>` (of its tied set's first FQN) for SEED, cast
to DTYPE as torch casts (f32, bf16, f16); nothing else is there; the export
has at least MIN_FILES safetensors files.
"""
import sys

import torch
from export_common import DTYPES, expected, load_export, tied_sources

out_dir, model_json, seed, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
min_files = int(sys.argv[5]) if len(sys.argv) > 5 else 1
tensors, files = load_export(out_dir)
sources = tied_sources(model_json)
assert set(tensors) == set(sources), set(tensors) ^ set(sources)
assert len(files) >= min_files, files
for name, tensor in tensors.items():
    want = expected("model." + sources[name], list(tensor.shape), seed).to(DTYPES[dtype])
    assert tensor.dtype == DTYPES[dtype], (name, tensor.dtype)
    assert torch.equal(tensor, want), name
print(f"{len(tensors)} tensors in {len(files)} file{'s' if len(files) > 1 else ''}, "
      f"every value equal ({dtype})")
