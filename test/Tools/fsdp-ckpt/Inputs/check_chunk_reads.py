"""Checks that a load through the chunk index read neither `.metadata` nor
`.fsdp-index`: against the same load through them (the chunk index removed),
each rank read exactly their bytes less, plus part of the chunk index.

usage: check_chunk_reads.py CKPT WITH_INDEX.json WITHOUT_INDEX.json
"""
import json
import os
import sys

ckpt, with_index, without_index = sys.argv[1:]
size = {name: os.path.getsize(os.path.join(ckpt, name))
        for name in (".metadata", ".fsdp-index", ".fsdp-chunks")}
fast = json.load(open(with_index))["ranks"]
slow = json.load(open(without_index))["ranks"]
assert len(fast) == len(slow), (fast, slow)
for a, b in zip(fast, slow):
    # What the index path read of .fsdp-chunks: the rest of the difference.
    chunks_read = a["bytes_read_storage"] - b["bytes_read_storage"] + size[".metadata"] + \
        size[".fsdp-index"]
    assert 0 < chunks_read <= size[".fsdp-chunks"], (a, b, size)
print(f"{len(fast)} ranks read neither .metadata nor .fsdp-index")
