#!/usr/bin/env python3
"""Reads a DCP checkpoint with CPython alone (zipfile + pickle with torch
stand-ins, no torch) and compares every value with a values.json of the
fixture: every element of every tensor (assembled from its chunks, each
element covered exactly once) and the repr of every bytes item.

usage: compare_values.py CHECKPOINT_DIR VALUES_JSON
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


def main(ckpt, values_path):
    expected = json.load(open(values_path))["values"]
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        md = pickle.load(f)
    storage = {(i.fqn, tuple(getattr(i, "offset", None) or ())): info
               for i, info in md.storage_data.items()}
    checked = 0
    for key, want in expected.items():
        meta = md.state_dict_metadata.get(key)
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
            floats = array.array("f", archive.read(data))
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
    print(f"OK: {len(expected)} keys, {checked} elements equal values.json, files {' '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
