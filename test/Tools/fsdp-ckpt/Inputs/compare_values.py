#!/usr/bin/env python3
"""Reads a DCP checkpoint with CPython alone (zipfile + pickle with torch
stand-ins, no torch) and compares every value with a values.json of the
fixture: every element of every tensor (assembled from its chunks, each
element covered exactly once; float32 and bfloat16, the dtype as
values.json has it) and the repr of every bytes item.

usage: compare_values.py CHECKPOINT_DIR VALUES_JSON [--allow-extra]

With --allow-extra, keys of values.json that the checkpoint does not hold (a
source's keys a plan does not name, which `fsdp-ckpt reshard --allow-extra`
drops) are skipped and listed on the OK line instead of failing. Keys the
checkpoint holds beyond values.json are listed there too.
"""
import array
import importlib.util
import io
import json
import math
import os
import pickle
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
STANDINS = os.path.join(HERE, "..", "..", "..", "Format", "metadata_python_check.py")
spec = importlib.util.spec_from_file_location("standins", STANDINS)
standins = importlib.util.module_from_spec(spec)
spec.loader.exec_module(standins)


class ObjectUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} in a bytes item")


def item_archive(ckpt, info):
    with open(os.path.join(ckpt, info.relative_path), "rb") as f:
        f.seek(info.offset)
        return zipfile.ZipFile(io.BytesIO(f.read(info.length)))


def decode(dtype, raw):
    """The elements of a little-endian data/0 record as float32 values."""
    if dtype == "float32":
        return array.array("f", raw)
    if dtype == "bfloat16":  # the high half of a float32
        return array.array("f", b"".join(b"\0\0" + raw[i:i + 2]
                                         for i in range(0, len(raw), 2)))
    raise ValueError(f"dtype {dtype} is not supported")


def main(ckpt, values_path, allow_extra=False):
    expected = json.load(open(values_path))["values"]
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        md = pickle.load(f)
    storage = {(i.fqn, tuple(getattr(i, "offset", None) or ())): info
               for i, info in md.storage_data.items()}
    checked = 0
    skipped = []
    for key, want in expected.items():
        meta = md.state_dict_metadata.get(key)
        if meta is None and allow_extra:
            skipped.append(key)
            continue
        if meta is None:
            print(f"FAIL: {key} missing")
            return 1
        if "object" in want:
            archive = item_archive(ckpt, storage[(key, ())])
            name = [n for n in archive.namelist() if n.endswith("data.pkl")][0]
            got = repr(ObjectUnpickler(io.BytesIO(archive.read(name))).load())
            if got != want["object"]:
                print(f"FAIL: {key} = {got}, expected {want['object']}")
                return 1
            continue
        dtype = meta.properties.dtype.name
        if "torch." + dtype != want["dtype"]:
            print(f"FAIL: {key} dtype torch.{dtype}, expected {want['dtype']}")
            return 1
        shape = list(meta.size)
        if shape != want["shape"]:
            print(f"FAIL: {key} shape {shape}, expected {want['shape']}")
            return 1
        total = math.prod(shape)
        values = [None] * total
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        for chunk in meta.chunks:
            off, sz = list(chunk.offsets), list(chunk.sizes)
            archive = item_archive(ckpt, storage[(key, tuple(off))])
            data = [n for n in archive.namelist() if n.endswith("/data/0")][0]
            floats = decode(dtype, archive.read(data))
            count = math.prod(sz)
            if len(floats) != count:
                print(f"FAIL: {key} chunk {off}: {len(floats)} elements, expected {count}")
                return 1
            for local in range(count):
                index, rest = 0, local
                for d in range(len(sz)):
                    inner = math.prod(sz[d + 1:])
                    index += (off[d] + rest // inner) * strides[d]
                    rest %= inner
                if values[index] is not None:
                    print(f"FAIL: {key} element {index} covered twice")
                    return 1
                values[index] = floats[local]
        for index, (got, want_value) in enumerate(zip(values, want["values"])):
            if got is None:
                print(f"FAIL: {key} element {index} not covered")
                return 1
            if array.array("f", [want_value])[0] != got:
                print(f"FAIL: {key} element {index} = {got}, expected {want_value}")
                return 1
        checked += total
    files = sorted({i.relative_path for i in md.storage_data.values()})
    line = (f"OK: {len(expected) - len(skipped)} keys, {checked} elements equal values.json, "
            f"files {' '.join(files)}")
    if skipped:
        line += f"; not in the checkpoint: {' '.join(skipped)}"
    unexpected = [k for k in md.state_dict_metadata if k not in expected]
    if unexpected:
        line += f"; not in values.json: {' '.join(unexpected)}"
    print(line)
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--allow-extra"]
    if len(args) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(args[0], args[1], allow_extra="--allow-extra" in sys.argv[1:]))
