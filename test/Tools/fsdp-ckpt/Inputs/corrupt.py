#!/usr/bin/env python3
"""Damages one part of a checkpoint directory, for the fault-detection tests.

usage: corrupt.py DIR KIND
  item      flip one byte inside the raw data of the last item of __1_0.distcp
  model-item  the same in the last `model.` item of __1_0.distcp (what an export reads)
  header    flip one byte inside the zip header of the first item of __0_0.distcp
  padding   write a non-zero byte into the alignment padding of __0_0.distcp
  metadata  flip one byte in the middle of .metadata
  index     flip one byte in the middle of .fsdp-index
  chunks    flip one byte in the middle of .fsdp-chunks
  chunk-records  flip one byte in the last record of .fsdp-chunks (past its directory)
  truncate  cut the last 100 bytes off __2_0.distcp
  missing   delete __3_0.distcp
Item positions come from the integrity index (the tests do not hard-code them).
"""
import os
import struct
import sys


def read_index(path):
    data = open(path, "rb").read()
    pos = 8 + 4 + 8
    (n,) = struct.unpack_from("<I", data, pos)
    pos += 4 + n + 16
    (count,) = struct.unpack_from("<Q", data, pos)
    pos += 8
    items = []
    for _ in range(count):
        fields = []
        for _ in range(2):
            (n,) = struct.unpack_from("<I", data, pos)
            fields.append(data[pos + 4:pos + 4 + n].decode())
            pos += 4 + n
        offset, length, _ = struct.unpack_from("<QQQ", data, pos)
        pos += 24
        items.append((fields[0], fields[1], offset, length))
    return items


def flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x5A]))


def main(d, kind):
    items = read_index(os.path.join(d, ".fsdp-index"))
    if kind == "item":
        key, name, offset, length = [i for i in items if i[1] == "__1_0.distcp"][-1]
        flip(os.path.join(d, name), offset + length - 200)  # raw data precedes the trailer
    elif kind == "model-item":
        key, name, offset, length = [i for i in items
                                     if i[1] == "__1_0.distcp" and i[0].startswith("model.")][-1]
        flip(os.path.join(d, name), offset + length - 200)
    elif kind == "header":
        key, name, offset, length = sorted(i for i in items if i[1] == "__0_0.distcp")[0]
        flip(os.path.join(d, name), offset + 40)
    elif kind == "padding":
        first = min((i for i in items if i[1] == "__0_0.distcp"), key=lambda i: i[2])
        flip(os.path.join(d, "__0_0.distcp"), first[2] + first[3] + 10)
    elif kind == "metadata":
        path = os.path.join(d, ".metadata")
        flip(path, os.path.getsize(path) // 2)
    elif kind == "index":
        path = os.path.join(d, ".fsdp-index")
        flip(path, os.path.getsize(path) // 2)
    elif kind == "chunks":
        path = os.path.join(d, ".fsdp-chunks")
        flip(path, os.path.getsize(path) // 2)
    elif kind == "chunk-records":
        path = os.path.join(d, ".fsdp-chunks")
        flip(path, os.path.getsize(path) - 40)
    elif kind == "truncate":
        path = os.path.join(d, "__2_0.distcp")
        os.truncate(path, os.path.getsize(path) - 100)
    elif kind == "missing":
        os.remove(os.path.join(d, "__3_0.distcp"))
    else:
        sys.exit(f"unknown kind {kind}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
