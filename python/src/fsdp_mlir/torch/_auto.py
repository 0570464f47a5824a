"""The drop-in path: a model that was never attached is described from what its framework
recorded on it (units, mesh, placements, dtypes), compiled once into a cache and attached.

The cache (python/README.md, "Drop-in"): one directory per (description, build of the tools),
named by a hash of both, holding what fm.compile wrote (model.json, layout.json,
model.fsdpplan). Nothing read from it is trusted: before use, the entry's description must be
this one, its plan must open and place every item of this rank where its layout says, and
attach then checks the layout against the live model's parameters. An entry that fails any of
these is compiled again and replaced atomically; a failure is never fatal while a fresh compile
can fix it. The cache root and its entries are private (0700, whatever the umask); a root that
another user owns, or that its group or others may write, is not used (a warning says so, and
the plan is compiled into a private directory of this process instead)."""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
import uuid
import warnings
from typing import Any, Dict, Optional, Tuple

from ._describe import describe
from .adapters import find as find_adapter

#: What an entry holds and how it is checked; a change here misses every older entry.
_ENTRY_FORMAT = 2
_FILES = ("model.json", "layout.json", "model.fsdpplan")
_STATE_ROLES = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")
_private_roots = []  # this process's stand-in roots (an unsafe cache root), removed at exit


def cache_root() -> str:
    """$FSDP_MLIR_CACHE, else ~/.cache/fsdp-mlir/plans."""
    root = os.environ.get("FSDP_MLIR_CACHE")
    if not root:
        root = os.path.join(os.path.expanduser("~"), ".cache", "fsdp-mlir", "plans")
    return root


def tools_build() -> str:
    """What identifies the build that compiles and reads plans: this entry format, the
    fsdp_mlir package's version, and the size and modification time of fsdp-translate,
    fsdp-opt and the extension (any rebuild or upgrade changes one of them, without running a
    tool; a tool not found reads "missing", and compiling then fails naming it). Part of every
    cache key, so no plan of another build is ever used."""
    import fsdp_mlir as fm
    from .. import _core
    parts = [f"entry-v{_ENTRY_FORMAT}"]
    try:
        from importlib.metadata import version
        parts.append(f"fsdp_mlir {version('fsdp_mlir')}")
    except Exception:  # not installed as a distribution (a source tree on sys.path)
        parts.append("fsdp_mlir (no version)")
    for name in ("fsdp-translate", "fsdp-opt", "_core"):
        try:
            path = _core.__file__ if name == "_core" else fm.find_tool(name)
            st = os.stat(path)
            parts.append(f"{name} {os.path.realpath(path)} {st.st_size} {st.st_mtime_ns}")
        except (OSError, FileNotFoundError):
            parts.append(f"{name} missing")
    return "\n".join(parts)


def cache_key(desc) -> str:
    """The entry name of `desc` compiled by this build (tools_build)."""
    text = json.dumps(desc, sort_keys=True)
    return hashlib.sha256((tools_build() + "\n\n" + text).encode()).hexdigest()[:32]


def _make_private_dirs(path: str) -> None:
    """Creates `path` and any missing parents 0700, whatever the umask (parents that exist
    are left as they are)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue
        os.chmod(d, 0o700)  # mkdir's mode is masked by the umask; chmod's is not


def _unsafe(root: str) -> Optional[str]:
    st = os.lstat(root)
    if stat.S_ISLNK(st.st_mode):
        st = os.stat(root)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not this user ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def usable_root() -> str:
    """The cache root, created 0700 when missing. One that another user owns or that its
    group or others may write is not used: anyone who can write it could plant a plan (the
    checks would recompile it, but could not stop a plan made to pass them), so this process
    compiles into a private directory of its own instead, removed at exit, and says so once."""
    root = os.path.abspath(cache_root())
    _make_private_dirs(root)
    why = _unsafe(root)
    if why is None:
        return root
    if not _private_roots:
        _private_roots.append(tempfile.mkdtemp(prefix="fsdp-mlir-plans-"))
        atexit.register(shutil.rmtree, _private_roots[0], True)
        warnings.warn(f"fsdp_mlir: the plan cache {root} {why}, so it is not used; compiling "
                      f"into {_private_roots[0]} for this process (chmod 700 it, or set "
                      "FSDP_MLIR_CACHE to a directory of your own)", RuntimeWarning,
                      stacklevel=3)
    return _private_roots[0]


def _short(name: str) -> str:
    from ._dtypes import short_dtype
    return short_dtype(name, "plan")


def _plan_problem(plan: str, layout: Dict[str, Any], rank: int) -> Optional[str]:
    """Why the plan file does not do what its layout says on this rank (None when it does):
    the mesh, this rank's buffers, and every item read from or written to a buffer (key, role,
    dtype, place in the shard, chunk, global shape), and that every piece this rank holds is
    loaded. A plan compiled from another description (two same-shaped weights swapped, say)
    puts some key elsewhere."""
    from .. import _core
    try:
        info = json.loads(_core.plan_json(plan, rank))
    except Exception as e:  # garbled, truncated, another format version, no part for rank
        return f"its plan does not open: {str(e).splitlines()[0] if str(e) else e!r}"
    mesh = [(a["name"], a["size"]) for a in layout["mesh"]]
    if [(a["name"], a["size"]) for a in info.get("mesh", [])] != mesh:
        return "its plan's mesh is not its layout's"
    parts = info.get("ranks") or []
    if len(parts) != 1 or parts[0].get("rank") != rank:
        return f"its plan has no part for rank {rank}"
    part = parts[0]
    buffers, expected, members = [], {}, []
    for gi, g in enumerate(layout["groups"]):
        begin = next((r["begin"] for r in g["ranks"] if r["rank"] == rank), None)
        roles = {b["role"]: _short(b["dtype"]) for b in g["buffers"]}
        buffers += [(gi, b["role"], roles[b["role"]], g["shard_size"], begin)
                    for b in g["buffers"]]
        coord = g["experts"]["expert_coords"][rank] if "experts" in g else None
        for p in g["params"]:
            c = next((c for c in p["chunks"] if c["rank"] == rank), None)
            if c is None or c["rows"] == 0:
                continue
            shape = list(p["shape"])
            row = math.prod(shape[1:])
            names = ([p["global_fqns"][coord]] if coord is not None
                     else [p["fqn"]] + list(p.get("tied_fqns", [])))
            chunk = (([c["row_offset"]] + [0] * (len(shape) - 1), [c["rows"]] + shape[1:])
                     if shape else ([], []))
            where = (gi, c["local_offset"], c["rows"] * row) + chunk + (shape,)
            members.append(["model." + n for n in names])
            for n in names:
                expected["model." + n] = ("main_weight", roles["main_weight"]) + where
            for role in (r for r in roles if r in _STATE_ROLES):
                expected[f"optimizer.state.{names[0]}.{role}"] = (role, roles[role]) + where
    have = [(b["group"], b["role"], _short(b["dtype"]), b["elements"], b["range_begin"])
            for b in part.get("buffers", [])]
    if have != buffers:
        return f"its plan's buffers of rank {rank} are not its layout's"
    read = set()
    for kind, ref_key in (("writes", "from"), ("reads", "to")):
        for item in part.get(kind, []):
            if item.get("source") != "buffer":
                continue
            key = item["key"]
            ref = item[ref_key]
            got = (ref["role"], _short(item["dtype"]), ref["group"], ref["local_offset"],
                   ref["elements"], list(item["chunk_offsets"]), list(item["chunk_sizes"]))
            want = expected.get(key)
            # Reads name no global shape; writes do.
            if (want is None or want[:7] != got
                    or ("global_shape" in item and list(item["global_shape"]) != want[7])):
                return (f"its plan puts {key} of rank {rank} elsewhere than its layout"
                        if key in expected else f"its plan has {key}, which its layout lacks")
            if kind == "reads":
                read.add(key)
    for names in members:
        if not read.intersection(names):
            return f"its plan never loads {names[0]} on rank {rank}"
    return None


def _entry_problem(final: str, desc, rank: int) -> Optional[str]:
    """Why the cache entry `final` may not be used for `desc` on this rank (None: it may).
    attach checks its layout against the live parameters afterwards."""
    if not os.path.isdir(final):
        return "missing"
    for name in _FILES:
        if not os.path.isfile(os.path.join(final, name)):
            return f"it has no {name}"
    try:
        with open(os.path.join(final, "model.json")) as f:
            if json.load(f) != json.loads(json.dumps(desc)):
                return "its model.json is another model's description"
        with open(os.path.join(final, "layout.json")) as f:
            layout = json.load(f)
        if layout.get("format") != "fsdp-layout-v1":
            return "its layout.json is not an fsdp-layout-v1 document"
        opt = desc.get("optimizer")
        want = (list(opt.get("state", [])), _short(opt.get("state_dtype", "f32"))) if opt else ([], None)
        for g in layout["groups"]:
            state = [b for b in g["buffers"] if b["role"] in _STATE_ROLES]
            got = ([b["role"] for b in state], _short(state[0]["dtype"]) if state else None)
            if g["requires_grad"] and got != want and (want[0] or got[0]):
                return "its layout's optimizer state is not the optimizer's"
        return _plan_problem(os.path.join(final, "model.fsdpplan"), layout, rank)
    except (OSError, ValueError, KeyError, TypeError, IndexError, StopIteration) as e:
        return f"it does not read ({type(e).__name__}: {e})"


def _compile_into(desc, final: str, rank: int = 0, replace: bool = False) -> None:
    """Compiles into a fresh private directory beside `final`, then renames it into place. An
    entry already there that passes the checks (another process compiled it meanwhile) is
    kept unless `replace`; a broken one (a leftover without its plan, a garbled file) is
    moved aside and removed, so a save never fails on it."""
    import fsdp_mlir as fm
    parent = os.path.dirname(final)
    _make_private_dirs(parent)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(final) + ".tmp-", dir=parent)  # 0700
    try:
        with open(os.path.join(tmp, "model.json"), "w") as f:
            json.dump(desc, f, sort_keys=True)
        fm.compile(os.path.join(tmp, "model.json"), out_dir=tmp)
        for attempt in range(8):
            try:
                os.rename(tmp, final)  # atomic; fails while `final` is a non-empty directory
                return
            except OSError:
                if not os.path.lexists(final):
                    continue
            if not replace and _entry_problem(final, desc, rank) is None:
                return  # another compiler's entry, as good as ours
            aside = f"{final}.stale-{uuid.uuid4().hex[:12]}"
            try:
                os.rename(final, aside)
            except FileNotFoundError:
                continue  # another process moved it aside first
            if os.path.isdir(aside) and not os.path.islink(aside):
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.unlink(aside)
        raise OSError(f"{final}: could not put the compiled plan in place (other processes "
                      "keep replacing it)")
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def _distributed():
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _max_over_ranks(values):
    """Each value's maximum over the ranks (a collective every rank must call)."""
    import torch
    import torch.distributed as dist
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def _compiled_plan(desc, force: bool = False) -> Tuple[str, bool]:
    """(plan path, whether this call compiled it). Under torch.distributed the first rank
    compiles while the others wait, then every rank checks its own copy (a cache that is not
    shared between nodes compiles there too); every rank gets the same error if one fails.
    force: compile again whatever the entry holds (rank 0 replaces the cache's entry; the
    other ranks compile privately, since they cannot tell whether they share it)."""
    import torch.distributed as dist
    distributed = _distributed()
    rank = dist.get_rank() if distributed else 0
    root = usable_root()
    final = os.path.join(root, cache_key(desc))
    plan = os.path.join(final, "model.fsdpplan")
    error, fresh = None, False
    if not distributed or rank == 0:
        try:
            if force or _entry_problem(final, desc, rank) is not None:
                _compile_into(desc, final, rank, replace=force)
                fresh = True
        except Exception as e:  # reported on every rank below
            error = e
    if distributed:
        if _max_over_ranks([0 if error is None else 1])[0]:
            if error is not None:
                raise error
            raise RuntimeError("compiling the model's plan failed on rank 0 (see its error)")
        if rank != 0:
            if force:
                final = tempfile.mkdtemp(prefix="fsdp-mlir-plan-")
                atexit.register(shutil.rmtree, final, True)
                plan = os.path.join(final, "model.fsdpplan")
            if force or _entry_problem(final, desc, rank) is not None:
                # A cache that is not shared between nodes (or a forced recompile).
                if force:
                    import fsdp_mlir as fm
                    fm.compile(desc, out_dir=final)
                else:
                    _compile_into(desc, final, rank)
                fresh = True
    elif error is not None:
        raise error
    return plan, fresh


def compiled_plan(desc) -> str:
    """The plan of `desc` from the cache, checked against it, compiled on first use (or when
    the entry fails the checks). Under torch.distributed the first rank compiles while the
    others wait; every rank gets the same error if it fails."""
    return _compiled_plan(desc)[0]


def description_of(model, optimizer, what: str) -> Dict[str, Any]:
    """The description the drop-in path compiles for `model` (its framework's records)."""
    adapter = find_adapter(model)
    why = adapter.refuse(model)
    if why:
        raise ValueError(f"{what}: {why}")
    options = adapter.describe_options(model, optimizer)
    if options is None:
        raise ValueError(
            f"{what}: the model was never attached and its framework ({adapter.name}) does not "
            "record its units and mesh: describe it (fm.torch.describe), compile it "
            "(fm.compile) and call fm.torch.attach(model, optimizer, plan, comm) once")
    desc = describe(model, optimizer=optimizer, **options)
    if "optimizer" in desc:
        # Hyper-parameters are live (every save writes the optimizer's own): the plan needs only
        # which state the optimizer keeps, so an LR schedule never changes the cache key.
        # `state` (checked against amsgrad / momentum) decides the buffers; a nonzero momentum
        # is kept as 1, so a momentum schedule does not either.
        opt = desc["optimizer"]
        kept = {k: opt[k] for k in ("kind", "state_dtype", "amsgrad", "state") if k in opt}
        if opt.get("momentum"):
            kept["momentum"] = 1.0
        desc["optimizer"] = kept
    return desc


def attach_from_model(model, optimizer, what: str):
    from ._attach import attach, attached
    from ._layout import LayoutMismatch
    desc = description_of(model, optimizer, what)
    plan, fresh = _compiled_plan(desc)
    try:
        attach(model, optimizer, plan)
        error = None
    except Exception as e:
        error = e
    # A cached layout that does not fit the live parameters (a planted or stale entry that
    # passed the file checks) is compiled again once; a fresh compile's mismatch is the
    # model's and is raised. Every rank takes the same branch.
    stale = error is not None and not fresh and isinstance(error, LayoutMismatch)
    if _distributed():
        stale, failed = _max_over_ranks([int(stale), int(error is not None)])
    else:
        stale, failed = int(stale), int(error is not None)
    if stale:
        plan, _ = _compiled_plan(desc, force=True)
        attach(model, optimizer, plan)
    elif failed:
        if error is not None:
            raise error
        raise ValueError(f"{what}: attaching the model failed on another rank (its error says "
                         "why)")
    return attached(model)
