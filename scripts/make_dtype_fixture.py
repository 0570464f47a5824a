#!/usr/bin/env python3
"""Makes test/Inputs/torch-2.15.0-dtypes/: tensors of the dtypes PyTorch 2.15's DCP saves as
torch.storage.UntypedStorage with _rebuild_tensor_v3 (float8 variants, uint16-64) and a few
others, written by dcp.save in one process. A one-off tool for people, never run by CI:

    python scripts/make_dtype_fixture.py OUT_DIR      # with torch 2.15 installed

OUT_DIR/checkpoint/ holds every dtype safetensors can name; OUT_DIR/e8m0/ float8_e8m0fnu alone
(safetensors has no name for it); OUT_DIR/values.json every tensor's dtype, shape and raw
little-endian bytes (hex), as torch holds them.
"""
import json
import os
import sys

import torch
import torch.distributed.checkpoint as dcp


def tensors():
    torch.manual_seed(0)
    base = torch.randn(4, 3) * 4
    ints = torch.arange(12, dtype=torch.int64).reshape(4, 3) * 1000 + 7
    return {
        "f8_e4m3fn": base.to(torch.float8_e4m3fn),
        "f8_e5m2": base.to(torch.float8_e5m2),
        "f8_e4m3fnuz": base.to(torch.float8_e4m3fnuz),
        "f8_e5m2fnuz": base.to(torch.float8_e5m2fnuz),
        "u16": ints.to(torch.uint16),
        "u32": (ints * 70000).to(torch.uint32),
        "u64": (ints * 2**40).to(torch.uint64),
        "c64": torch.complex(base, -base),
        "bf16": base.to(torch.bfloat16),
        "f32": base,
    }


def main(out):
    values = {"torch": torch.__version__, "tensors": {}}
    sets = {"checkpoint": tensors(), "e8m0": {"f8_e8m0fnu": (torch.randn(4, 3).abs() * 8).to(
        torch.float8_e8m0fnu)}}
    for directory, sd in sets.items():
        dcp.save(sd, checkpoint_id=os.path.join(out, directory), no_dist=True)
        for key, t in sd.items():
            values["tensors"][key] = {
                "checkpoint": directory, "dtype": str(t.dtype).replace("torch.", ""),
                "shape": list(t.shape),
                "bytes": t.contiguous().view(torch.uint8).numpy().tobytes().hex()}
    with open(os.path.join(out, "values.json"), "w") as f:
        json.dump(values, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
