"""Checks the --stats-json files of stats-json.test against the checkpoints.

usage: check_stats.py WORKDIR FSDP_CKPT
"""
import json
import os
import subprocess
import sys

work, fsdp_ckpt = sys.argv[1], sys.argv[2]


def size_of(ckpt):
    """Every byte a save writes: the items (not the zero padding between
    them, which stays a hole), `.metadata`, the index and the chunk index."""
    listing = json.loads(subprocess.check_output([fsdp_ckpt, "inspect", "--json", ckpt]))
    items = sum(f["bytes"] for f in listing["files"])
    return items + sum(os.path.getsize(os.path.join(ckpt, name))
                       for name in (".metadata", ".fsdp-index", ".fsdp-chunks"))


def ranks(name, op, count, loads):
    """The entries; an operation that loads also says how many threads it read on."""
    stats = json.load(open(os.path.join(work, name)))
    assert stats["op"] == op, stats["op"]
    entries = stats["ranks"]
    assert [e["rank"] for e in entries] == list(range(count)), entries
    for e in entries:
        assert set(e) == {"rank", "seconds", "stall_seconds", "bytes_read_storage",
                          "bytes_written_storage", "bytes_from_peers"} | (
                              {"readers", "bytes_read_in_place"} if loads else set()), e
        assert e["seconds"] > 0 and e["bytes_from_peers"] == 0, e
        assert not loads or (isinstance(e["readers"], int) and e["readers"] >= 1), e
        assert not loads or 0 <= e["bytes_read_in_place"] <= e["bytes_read_storage"], e
    return entries


save = ranks("save.json", "save", 4, loads=False)
written = sum(e["bytes_written_storage"] for e in save)
assert written == size_of(os.path.join(work, "ckpt")), (written, size_of(os.path.join(work, "ckpt")))
print("save: 4 ranks, written = checkpoint size")

load = ranks("load.json", "load", 3, loads=True)
assert all(e["bytes_written_storage"] == 0 and e["bytes_read_storage"] > 0 for e in load), load
assert all(e["stall_seconds"] == e["seconds"] for e in load), load
print("load: 3 ranks, read >= loaded, nothing written, stall = seconds")

reshard = ranks("reshard.json", "reshard", 3, loads=True)
written = sum(e["bytes_written_storage"] for e in reshard)
assert written == size_of(os.path.join(work, "three")), written
assert all(e["bytes_read_storage"] > 0 for e in reshard), reshard
print("reshard: 3 ranks, written = checkpoint size, read > 0")
