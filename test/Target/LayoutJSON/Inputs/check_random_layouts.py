#!/usr/bin/env python3
"""End-to-end check of the compiler's layouts against an independent model.

Generates random fsdp-model-v1 descriptions (meshes, placements, nested units,
mixed dtypes, frozen and tied parameters), runs import -> lowering -> layout
JSON through the real tools, and compares every group, offset, chunk and rank
range with a plain re-statement of Megatron-FSDP v2's rules
(docs/MegatronFSDPLayout.md) written here, independently of the C++.

usage: check_random_layouts.py FSDP_TRANSLATE FSDP_OPT [CASES] [SEED]
"""
import json
import math
import random
import subprocess
import sys


def rowsize(shape):
    return math.prod(shape[1:])


def numel(shape):
    return math.prod(shape)


def roundup(x, m):
    return -(-x // m) * m


def pack(shapes, dp):
    """GlobalLayout.build: offsets per tensor, chunk, size."""
    chunk = math.lcm(*[rowsize(s) for s in shapes]) if shapes else 1
    n = [numel(s) for s in shapes]
    regular = [i for i in range(len(shapes)) if n[i] >= chunk]
    fragments = sorted([i for i in range(len(shapes)) if n[i] < chunk],
                       key=lambda i: -n[i])
    off = {}
    nxt = 0
    while regular:
        t = regular.pop(0)
        off[t] = nxt
        if n[t] % chunk == 0:
            nxt += n[t]
            continue
        gap = nxt + n[t]
        nxt += roundup(n[t], chunk)
        gap_end = nxt
        rem = n[t] % chunk
        conj = next((u for u in regular
                     if n[u] % chunk and rem + n[u] % chunk <= chunk), None)
        if conj is not None:
            regular.remove(conj)
            off[conj] = nxt - n[conj] % chunk
            gap_end = off[conj]
            nxt += (n[conj] // chunk) * chunk
        for f in list(fragments):
            a = roundup(gap, rowsize(shapes[f]))
            if a + n[f] <= gap_end:
                off[f] = a
                gap = a + n[f]
                fragments.remove(f)
    for f in fragments:
        nxt = roundup(nxt, rowsize(shapes[f]))
        off[f] = nxt
        nxt += n[f]
    return [off[i] for i in range(len(shapes))], chunk, roundup(nxt, chunk * dp)


def local_range(size, sizes, coords, placements):
    offset, n = 0, size
    for axis in reversed(range(len(sizes))):
        if placements[axis] == "shard":
            n //= sizes[axis]
            offset += coords[axis] * n
    return offset, offset + n


def coords_of(rank, sizes):
    out = []
    for s in reversed(sizes):
        out.append(rank % s)
        rank //= s
    return out[::-1]


DTYPES = ["bf16", "f32", "f16"]


def random_model(rng):
    axes = rng.choice([1, 1, 2, 2, 3])
    sizes = [rng.randint(1, 4) for _ in range(axes)]
    nshard = rng.randint(1, axes)
    placements = ["replicate"] * (axes - nshard) + ["shard"] * nshard
    counter = [0]

    def params(k):
        out = []
        for _ in range(k):
            counter[0] += 1
            rank = rng.choice([1, 1, 2, 2, 3])
            shape = [rng.randint(1, 9) for _ in range(rank)]
            if rng.random() < 0.2:
                shape[0] *= rng.randint(5, 40)
            p = {"name": f"p{counter[0]}", "shape": shape,
                 "dtype": rng.choice(DTYPES)}
            if rng.random() < 0.1:
                p["requires_grad"] = False
            out.append(p)
        return out

    def module(name, depth, unit):
        m = {"name": name}
        if unit:
            m["fully_shard"] = {"placements": placements}
        m["params"] = params(rng.randint(0, 4))
        if depth < 2:
            m["children"] = [module(f"m{i}", depth + 1, rng.random() < 0.4)
                             for i in range(rng.randint(0, 3))]
        return m

    root = module("", 0, True)
    del root["name"]
    # A tie inside the root's own parameters, now and then.
    own = root["params"]
    if own and rng.random() < 0.3:
        target = own[0]
        own.append({"name": "tied", "shape": target["shape"],
                    "dtype": target["dtype"],
                    "requires_grad": target.get("requires_grad", True),
                    "tied_to": target["name"]})
    return {"format": "fsdp-model-v1",
            "mesh": [{"name": f"a{i}", "size": s} for i, s in enumerate(sizes)],
            "module": root}


def expected_groups(model):
    """Grouping, then packing, rank ranges and pieces for every group."""
    sizes = [a["size"] for a in model["mesh"]]
    world = math.prod(sizes)
    groups = []

    def fqn(prefix, name):
        return f"{prefix}.{name}" if prefix else name

    def visit_units(m, prefix):
        if "fully_shard" in m:
            owned = []

            def collect(mod, pre):
                for p in mod.get("params", []):
                    owned.append((fqn(pre, p["name"]), p))
                for c in mod.get("children", []):
                    if "fully_shard" not in c:
                        collect(c, fqn(pre, c["name"]))
            collect(m, prefix)
            keyed = {}
            for name, p in owned:
                storage = p
                if "tied_to" in p:
                    storage = next(q for n, q in owned if n == p["tied_to"])
                key = (storage["dtype"], storage.get("requires_grad", True))
                g = keyed.setdefault(key, {"members": [], "index": {}})
                sid = id(storage)
                if sid not in g["index"]:
                    g["index"][sid] = len(g["members"])
                    g["members"].append({"fqns": [], "shape": storage["shape"]})
                g["members"][g["index"][sid]]["fqns"].append(name)
            for (dtype, trainable), g in keyed.items():
                groups.append((prefix, dtype, trainable, g["members"],
                               m["fully_shard"]["placements"]))
        for c in m.get("children", []):
            visit_units(c, fqn(prefix, c["name"]))

    visit_units(model["module"], "")
    out = []
    for unit, dtype, trainable, members, placements in groups:
        shapes = [mem["shape"] for mem in members]
        offsets, chunk, size = pack(shapes, world)
        ranks = []
        for r in range(world):
            b, e = local_range(size, sizes, coords_of(r, sizes), placements)
            ranks.append({"rank": r, "coords": coords_of(r, sizes),
                          "begin": b, "end": e})
        params = []
        for mem, o in zip(members, offsets):
            chunks = []
            rs = rowsize(mem["shape"])
            for rk in ranks:
                lo = max(o, rk["begin"])
                hi = min(o + numel(mem["shape"]), rk["end"])
                if lo < hi:
                    assert (lo - o) % rs == 0 and (hi - lo) % rs == 0
                    chunks.append({"rank": rk["rank"], "row_offset": (lo - o) // rs,
                                   "rows": (hi - lo) // rs,
                                   "local_offset": lo - rk["begin"]})
            p = {"fqn": mem["fqns"][0], "shape": mem["shape"], "offset": o,
                 "chunks": chunks}
            if len(mem["fqns"]) > 1:
                p["tied_fqns"] = mem["fqns"][1:]
            params.append(p)
        out.append({"unit": unit, "dtype": dtype, "requires_grad": trainable,
                    "chunk": chunk, "size": size, "params": params,
                    "ranks": ranks})
    return out


def main():
    translate, opt = sys.argv[1], sys.argv[2]
    cases = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1234)
    groups_checked = 0
    for case in range(cases):
        model = random_model(rng)
        text = json.dumps(model)
        imported = subprocess.run([translate, "--import-model-json"], input=text,
                                  capture_output=True, text=True)
        if imported.returncode:
            print(f"case {case}: import failed: {imported.stderr}\n{text}")
            return 1
        lowered = subprocess.run([opt, "--fsdp-lower-fully-shard"],
                                 input=imported.stdout, capture_output=True, text=True)
        if lowered.returncode:
            print(f"case {case}: lowering failed: {lowered.stderr}\n{text}")
            return 1
        emitted = subprocess.run([translate, "--emit-layout-json"],
                                 input=lowered.stdout, capture_output=True, text=True)
        if emitted.returncode:
            print(f"case {case}: emit failed: {emitted.stderr}\n{text}")
            return 1
        got = json.loads(emitted.stdout)["groups"]
        for g in got:
            del g["buffers"]
            del g["shard_size"]
        want = expected_groups(model)
        if got != want:
            print(f"case {case}: layout differs from the reference model\n{text}")
            print("got: ", json.dumps(got)[:2000])
            print("want:", json.dumps(want)[:2000])
            return 1
        groups_checked += len(want)
    print(f"{cases} random models, {groups_checked} groups: all match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
