#!/usr/bin/env python3
"""Checks a safetensors export of test/Inputs/torch-2.15.0-dtypes/checkpoint against the bytes
torch holds (values.json): every tensor present with the safetensors dtype name its torch dtype
has, its shape, and its raw bytes equal. Pure Python: the file is an 8-byte header length, a
JSON header, then the data.

usage: check_dtype_export.py EXPORT_DIR VALUES_JSON
"""
import json
import os
import struct
import sys

SAFETENSORS = {"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
               "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
               "uint16": "U16", "uint32": "U32", "uint64": "U64", "complex64": "C64",
               "bfloat16": "BF16", "float32": "F32"}


def main(out, values_path):
    with open(values_path) as f:
        values = json.load(f)["tensors"]
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    want = {k: v for k, v in values.items() if v["checkpoint"] == "checkpoint"}
    got = {k for k in header if k != "__metadata__"}
    if got != set(want):
        sys.exit(f"FAIL: tensors {sorted(got)}, expected {sorted(want)}")
    for key, v in sorted(want.items()):
        entry = header[key]
        if entry["dtype"] != SAFETENSORS[v["dtype"]] or entry["shape"] != v["shape"]:
            sys.exit(f"FAIL: {key}: {entry['dtype']} {entry['shape']}, expected "
                     f"{SAFETENSORS[v['dtype']]} {v['shape']}")
        begin, end = entry["data_offsets"]
        if body[begin:end].hex() != v["bytes"]:
            sys.exit(f"FAIL: {key}: the bytes differ from torch's")
        print(f"{key} {entry['dtype']} {entry['shape']} bytes equal")


if __name__ == "__main__":
    main(*sys.argv[1:])
