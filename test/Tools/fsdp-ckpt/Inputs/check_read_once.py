"""Checks the --stats-json of an HSDP load against the checkpoint's items.

usage: check_read_once.py STATS_JSON CKPT FSDP_CKPT REPLICAS SHARED|RESHARDED|UNSHARED

SHARED: the ranks' storage reads sum to the items once (plus what every rank
reads to find them: `.metadata`, the indexes), and each replica group member
got the rest from its peers. RESHARDED: the same for a load into another
layout, where a saved chunk that two groups' pieces overlap is read (and
checked whole) by both: under 1.5 times the items. UNSHARED: every replica
read everything itself.
"""
import json
import os
import subprocess
import sys

stats_path, ckpt, fsdp_ckpt, replicas, mode = sys.argv[1:6]
replicas = int(replicas)
listing = json.loads(subprocess.check_output([fsdp_ckpt, "inspect", "--json", ckpt]))
items = sum(f["bytes"] for f in listing["files"])
side = sum(os.path.getsize(os.path.join(ckpt, name))
           for name in (".metadata", ".fsdp-index", ".fsdp-chunks"))
ranks = json.load(open(stats_path))["ranks"]
read = sum(r["bytes_read_storage"] for r in ranks)
peers = sum(r["bytes_from_peers"] for r in ranks)
# Every rank may read the side files' pages it needs, at most once.
overhead = len(ranks) * side
if mode in ("SHARED", "RESHARDED"):
    most = items if mode == "SHARED" else 1.5 * items
    assert items <= read <= most + overhead, (read, items, overhead)
    # Each byte reached the other replicas (replicas - 1) times.
    assert peers >= (replicas - 1) * items * 0.9, (peers, items)
    assert all(r["bytes_from_peers"] > 0 for r in ranks), ranks
else:
    assert replicas * items <= read <= replicas * items + overhead, (read, items, overhead)
    assert peers == 0, peers
print(f"{'shared' if mode == 'RESHARDED' else mode.lower()}: {len(ranks)} ranks read {read / items:.2f}x the items from storage")
