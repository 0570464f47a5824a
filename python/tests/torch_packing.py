"""Test support for fsdp_mlir.torch: torch models packed the way Megatron-FSDP packs them.

`pack(model, layout, rank, ...)` replaces every parameter of an ordinary torch model by a view
of this rank's shard of one flat `main_weight` buffer per parameter group, at the element
offset and with the true uneven rows the layout JSON names (docs/LayoutJSON.md): the same
bytes where Megatron-FSDP puts them. Model weights, gradients and the Adam moments get buffers
of the same layout; the optimizer's exp_avg / exp_avg_sq are views of them. Parameters are
DTensors (`from_local` with the seed's uneven chunk hooks) when a device mesh is given, plain
tensors otherwise.

Also: the test values of docs/TestValues.md computed with torch (checked against
test/Runtime/test_values.py), a differently packed layout (`naive_layout`) for refusal tests,
the tools, and a spawner for gloo process groups.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "test", "Runtime"))
import test_values  # noqa: E402  (standard library reference of the test values)

SHORT = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16,
         "f16": torch.float16, "i64": torch.int64, "i32": torch.int32, "i16": torch.int16,
         "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool}


# ---------------------------------------------------------------------------------------------
# tools


def tool(name):
    """A tool of the build: $FSDP_MLIR_BIN_DIR, $FSDP_MLIR_TOOLS, $FSDP_BUILD_DIR/bin, the
    repository's build/bin, then PATH."""
    import shutil
    dirs = [os.environ.get("FSDP_MLIR_BIN_DIR"), os.environ.get("FSDP_MLIR_TOOLS"),
            os.path.join(os.environ.get("FSDP_BUILD_DIR", os.path.join(ROOT, "build")), "bin")]
    for d in dirs:
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    return shutil.which(name) or os.path.join(ROOT, "build", "bin", name)


def compile_model(desc, out_dir, mesh=None, placements=None):
    """desc (dict or path) -> out_dir with model.json, model.mlir, lowered.mlir, layout.json and
    model.fsdpplan; returns (plan path, layout dict). Runs the tools directly, so the tests of
    describe do not depend on the bindings."""
    os.makedirs(out_dir, exist_ok=True)
    if isinstance(desc, dict):
        path = os.path.join(out_dir, "model.json")
        with open(path, "w") as f:
            json.dump(desc, f, indent=1)
    else:
        path = desc
    mlir = os.path.join(out_dir, "model.mlir")
    lowered = os.path.join(out_dir, "lowered.mlir")
    layout = os.path.join(out_dir, "layout.json")
    plan = os.path.join(out_dir, "model.fsdpplan")
    args = [tool("fsdp-translate"), "--import-model-json", path, "-o", mlir]
    if mesh:
        args += ["--mesh", mesh]
    if placements:
        args += ["--placements", placements]
    for cmd in (args,
                [tool("fsdp-opt"), mlir, "--fsdp-lower-fully-shard", "-o", lowered],
                [tool("fsdp-translate"), "--emit-layout-json", lowered, "-o", layout],
                [tool("fsdp-translate"), "--emit-checkpoint-plan", lowered, "-o", plan]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    with open(layout) as f:
        return plan, json.load(f)


def mpirun(np_, *args, timeout=120):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# models


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim, dtype=dtype))


class Attention(torch.nn.Module):
    def __init__(self, hidden, kv, dtype):
        super().__init__()
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False, dtype=dtype)  # noqa: E731
        self.q_proj, self.k_proj = lin(hidden, hidden), lin(hidden, kv)
        self.v_proj, self.o_proj = lin(hidden, kv), lin(hidden, hidden)


class MLP(torch.nn.Module):
    def __init__(self, hidden, inter, dtype):
        super().__init__()
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False, dtype=dtype)  # noqa: E731
        self.gate_proj, self.up_proj = lin(hidden, inter), lin(hidden, inter)
        self.down_proj = lin(inter, hidden)


class Layer(torch.nn.Module):
    def __init__(self, hidden, kv, inter, dtype):
        super().__init__()
        self.self_attn = Attention(hidden, kv, dtype)
        self.mlp = MLP(hidden, inter, dtype)
        self.input_layernorm = RMSNorm(hidden, dtype)
        self.post_attention_layernorm = RMSNorm(hidden, dtype)


class Rotary(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        # Frozen parameters of two dtypes: two frozen groups of the root unit.
        self.inv_freq = torch.nn.Parameter(
            1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)),
            requires_grad=False)


class Inner(torch.nn.Module):
    def __init__(self, vocab, hidden, kv, inter, layers, dtype):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, hidden, dtype=dtype)
        self.layers = torch.nn.ModuleList(Layer(hidden, kv, inter, dtype) for _ in range(layers))
        self.norm = RMSNorm(hidden, dtype)
        self.rotary_emb = Rotary(hidden // 2)
        self.pos_scale = torch.nn.Parameter(torch.ones(3, hidden // 4, dtype=dtype),
                                            requires_grad=False)


class TinyLlama(torch.nn.Module):
    """Llama-shaped (Hugging Face names): model.embed_tokens, model.layers.N.{self_attn,mlp,
    input_layernorm,post_attention_layernorm}, model.norm, lm_head tied to embed_tokens, plus
    frozen model.rotary_emb.inv_freq (f32) and model.pos_scale (bf16)."""

    def __init__(self, vocab=96, hidden=24, kv=12, inter=40, layers=2, dtype=torch.bfloat16,
                 tied=True):
        super().__init__()
        self.model = Inner(vocab, hidden, kv, inter, layers, dtype)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False, dtype=dtype)
        if tied:
            self.lm_head.weight = self.model.embed_tokens.weight


def llama_units(model):
    return [f"model.layers.{i}" for i in range(len(model.model.layers))]


# ---------------------------------------------------------------------------------------------
# test values (docs/TestValues.md), vectorised


def tv(key, first, count, seed, dtype=torch.float32):
    """Elements [first, first + count) of key's test values as a 1-d tensor of dtype
    (floating types: N / 256 rounded once from float32, as fsdp-ckpt does)."""
    h = test_values.fnv1a32(key)
    i = torch.arange(first, first + count, dtype=torch.int64)
    # i * 7919 + seed * 104729 + h fits int64 for every index a test uses (no wrap needed).
    n = (i * 7919 + (seed * 104729 + h)) % 65521 - 32760
    if dtype.is_floating_point:
        return (n.to(torch.float64) / 256).to(torch.float32).to(dtype)
    if dtype == torch.bool:
        return n % 2 != 0
    return n.to(dtype)


# ---------------------------------------------------------------------------------------------
# layouts


def group_rank(group, rank):
    for r in group["ranks"]:
        if r["rank"] == rank:
            return r
    raise KeyError(rank)


def piece(param, rank):
    """(row_offset, rows, local_offset) of param on rank; rows 0 when it holds none."""
    for c in param["chunks"]:
        if c["rank"] == rank:
            return c["row_offset"], c["rows"], c["local_offset"]
    return 0, 0, 0


def row_size(shape):
    return math.prod(shape[1:]) if len(shape) > 1 else 1


def naive_layout(layout):
    """The same groups packed another way: every tensor in member order at the next multiple
    of its row size (no conjugates, no hole filling), padded to chunk * D, cut evenly. A model
    packed like this has the same buffers but other offsets and other pieces."""
    out = json.loads(json.dumps(layout))
    world = math.prod(a["size"] for a in layout["mesh"])
    for g in out["groups"]:
        nxt = 0
        for p in g["params"]:
            rs = row_size(p["shape"])
            nxt = -(-nxt // rs) * rs
            p["offset"] = nxt
            nxt += math.prod(p["shape"])
        step = g["chunk"] * world
        g["size"] = max(-(-nxt // step) * step, step)
        shards = len({(r["begin"], r["end"]) for r in g["ranks"]})
        g["shard_size"] = g["size"] // shards
        for r in g["ranks"]:
            idx = r["begin"] // (r["end"] - r["begin"]) if r["end"] > r["begin"] else 0
            r["begin"], r["end"] = idx * g["shard_size"], (idx + 1) * g["shard_size"]
        for p in g["params"]:
            rs, off, n = row_size(p["shape"]), p["offset"], math.prod(p["shape"])
            p["chunks"] = []
            for r in g["ranks"]:
                lo, hi = max(off, r["begin"]), min(off + n, r["end"])
                if lo < hi:
                    p["chunks"].append({"rank": r["rank"], "row_offset": (lo - off) // rs,
                                        "rows": (hi - lo) // rs, "local_offset": lo - r["begin"]})
    return out


def first_difference(layout, other, rank):
    """The first parameter (layout order) whose piece on rank differs between two layouts."""
    for g, h in zip(layout["groups"], other["groups"]):
        for p, q in zip(g["params"], h["params"]):
            a, b = piece(p, rank), piece(q, rank)
            if a[1] != b[1] or (a[1] and a != b):
                return p["fqn"]
    return None


# ---------------------------------------------------------------------------------------------
# packing


class Packed:
    """A model packed from a layout on one rank: `buffers[(group, role)]` flat tensors, the
    optimizer, and per group the members with their pieces."""

    def __init__(self, model, optimizer, layout, rank, buffers, mesh):
        self.model, self.optimizer, self.layout, self.rank = model, optimizer, layout, rank
        self.buffers, self.mesh = buffers, mesh

    def attach_buffers(self):
        """The buffers no parameter leads to (model_weight, main_grad), for attach(buffers=)."""
        return {(g, role): t for (g, role), t in self.buffers.items()
                if role in ("model_weight", "main_grad")
                and t is not self.buffers[(g, "main_weight")]}

    def attach(self, plan, **kw):
        from fsdp_mlir import torch as fmt
        return fmt.attach(self.model, self.optimizer, plan, buffers=self.attach_buffers(), **kw)

    def group_buffers(self, role):
        return [self.buffers.get((i, role)) for i in range(len(self.layout["groups"]))]

    def pieces(self):
        """(group index, group, param entry, row_offset, rows, local_offset) for each tensor."""
        for gi, g in enumerate(self.layout["groups"]):
            for p in g["params"]:
                ro, rows, lo = piece(p, self.rank)
                yield gi, g, p, ro, rows, lo


def _set_param(model, fqn, param):
    mod_name, _, name = fqn.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    mod._parameters[name] = param


def _wrap(view, shape, row_offset, mesh, placements):
    if mesh is None:
        return view
    from fsdp_mlir.torch import attach_uneven_dtensor_metadata
    from torch.distributed.tensor import DTensor
    stride = torch.empty(shape, device="meta").stride()
    dt = DTensor.from_local(view, mesh, placements, run_check=False, shape=torch.Size(shape),
                            stride=stride)
    return attach_uneven_dtensor_metadata(dt, row_offset)


def _empty_row_offset(p, g, rank):
    """Megatron-FSDP's row offset of an empty piece: rows lower shards hold."""
    b = group_rank(g, rank)["begin"]
    n = math.prod(p["shape"])
    return min(max(b - p["offset"], 0), n) // row_size(p["shape"])


def pack(model, layout, rank, *, mesh=None, optimizer="adamw", lr=1e-3, betas=(0.9, 0.999),
         eps=1e-8, weight_decay=0.01, with_state=True, set_grad_dtype=False):
    """Pack `model` (an ordinary module, its global values kept) for `rank` as `layout` says.

    Parameters become views of main_weight (DTensors over mesh when given), tied names share
    one parameter; model_weight holds the cast of main_weight; exp_avg / exp_avg_sq are zero
    buffers whose views are the optimizer's state (with_state; step 0). set_grad_dtype: mark
    trainable parameters with `grad_dtype` = the main-grad dtype, as Megatron-FSDP does."""
    from torch.distributed.tensor import Shard
    placements = None
    if mesh is not None:
        placements = [Shard(0)] * mesh.ndim
    full = {k: v.detach().clone() for k, v in model.named_parameters(remove_duplicate=False)}
    buffers = {}
    params_of_group = []
    for gi, g in enumerate(layout["groups"]):
        n = g["shard_size"]
        roles = {b["role"]: b for b in g["buffers"]}
        for role, b in roles.items():
            if b.get("aliases") == "main_weight":
                continue
            buffers[(gi, role)] = torch.zeros(n, dtype=SHORT[b["dtype"]])
        if "model_weight" in roles and roles["model_weight"].get("aliases") == "main_weight":
            buffers[(gi, "model_weight")] = buffers[(gi, "main_weight")]
        members = []
        for p in g["params"]:
            ro, rows, lo = piece(p, rank)
            shape = list(p["shape"])
            rs = row_size(shape)
            local_shape = [rows] + shape[1:]
            if rows == 0:
                ro = _empty_row_offset(p, g, rank)
            views = {}
            for role in roles:
                views[role] = buffers[(gi, role)][lo: lo + rows * rs].view(local_shape)
            value = full[p["fqn"]][ro: ro + rows] if rows else None
            if rows:
                views["main_weight"].copy_(value)
                if "model_weight" in views and roles["model_weight"].get("aliases") is None:
                    views["model_weight"].copy_(value)
            param = torch.nn.Parameter(_wrap(views["main_weight"], shape, ro, mesh, placements),
                                       requires_grad=g["requires_grad"])
            if mesh is not None:
                # nn.Parameter(DTensor) detaches: a new local tensor (same storage), so the
                # chunk hooks go on the parameter's own.
                from fsdp_mlir.torch import attach_uneven_dtensor_metadata
                attach_uneven_dtensor_metadata(param, ro)
            if set_grad_dtype and g["requires_grad"] and "main_grad" in roles:
                param.grad_dtype = SHORT[roles["main_grad"]["dtype"]]
            for fqn in [p["fqn"]] + list(p.get("tied_fqns", [])):
                _set_param(model, fqn, param)
            members.append((p, param, views, ro, shape))
        params_of_group.append(members)
    opt = None
    if optimizer:
        cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[optimizer]
        opt = cls([p for p in model.parameters() if p.requires_grad], lr=lr, betas=betas,
                  eps=eps, weight_decay=weight_decay)
        if with_state:
            for gi, members in enumerate(params_of_group):
                if (gi, "exp_avg") not in buffers:
                    continue
                for p, param, views, ro, shape in members:
                    opt.state[param] = {
                        "step": torch.tensor(0.0),
                        "exp_avg": _wrap(views["exp_avg"], shape, ro, mesh, placements),
                        "exp_avg_sq": _wrap(views["exp_avg_sq"], shape, ro, mesh, placements),
                    }
    return Packed(model, opt, layout, rank, buffers, mesh)


def fill(packed, seed):
    """What `fsdp-ckpt save --fill seed` puts in this rank's buffers, written through torch:
    every main weight and moment piece from its key's test values, model_weight cast."""
    for gi, g, p, ro, rows, lo in packed.pieces():
        if not rows:
            continue
        rs, fqn = row_size(p["shape"]), p["fqn"]
        for role, key in (("main_weight", f"model.{fqn}"),
                          ("exp_avg", f"optimizer.state.{fqn}.exp_avg"),
                          ("exp_avg_sq", f"optimizer.state.{fqn}.exp_avg_sq")):
            buf = packed.buffers.get((gi, role))
            if buf is not None:
                buf[lo: lo + rows * rs].copy_(tv(key, ro * rs, rows * rs, seed, buf.dtype))
        mw = packed.buffers.get((gi, "model_weight"))
        if mw is not None and mw is not packed.buffers[(gi, "main_weight")]:
            mw[lo: lo + rows * rs].copy_(packed.buffers[(gi, "main_weight")][lo: lo + rows * rs])


def check(packed, seed, *, model_weight=True, moments=True):
    """Every element this rank holds equals its test value; model_weight the cast of it.
    Returns the number of elements checked; raises AssertionError naming the first miss."""
    checked = 0
    for gi, g, p, ro, rows, lo in packed.pieces():
        if not rows:
            continue
        rs, fqn = row_size(p["shape"]), p["fqn"]
        roles = [("main_weight", f"model.{fqn}")]
        if moments:
            roles += [("exp_avg", f"optimizer.state.{fqn}.exp_avg"),
                      ("exp_avg_sq", f"optimizer.state.{fqn}.exp_avg_sq")]
        for role, key in roles:
            buf = packed.buffers.get((gi, role))
            if buf is None:
                continue
            got = buf[lo: lo + rows * rs]
            want = tv(key, ro * rs, rows * rs, seed, buf.dtype)
            bad = (got != want).nonzero()
            if len(bad):
                i = int(bad[0])
                raise AssertionError(f"rank {packed.rank}: {key} element {ro * rs + i} ({role}) "
                                     f"is {got[i].item()}, expected {want[i].item()}")
            checked += got.numel()
        mw = packed.buffers.get((gi, "model_weight"))
        if model_weight and mw is not None:
            want = tv(f"model.{fqn}", ro * rs, rows * rs, seed, torch.float32).to(mw.dtype)
            got = mw[lo: lo + rows * rs]
            if not torch.equal(got, want):
                i = int((got != want).nonzero()[0])
                raise AssertionError(f"rank {packed.rank}: model_weight of {fqn} element "
                                     f"{ro * rs + i} is {got[i].item()}, expected "
                                     f"{want[i].item()}")
            checked += got.numel()
    return checked


# ---------------------------------------------------------------------------------------------
# processes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world, *args):
    """Run fn(rank, world, port, *args) in `world` gloo-ready processes (torch.multiprocessing
    spawn; an exception in any rank fails the call with its traceback)."""
    import torch.multiprocessing as mp
    port = free_port()
    mp.spawn(_entry, args=(fn, world, port, args), nprocs=world, join=True)


def _entry(rank, fn, world, port, args):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, port, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
