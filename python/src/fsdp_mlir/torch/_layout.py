"""The compiled layout as attach uses it: each group's members on this rank, and the check that
a tensor is a view of one packed buffer exactly where the layout puts it."""

from __future__ import annotations

import collections
import json
import math
import os
import shutil
import subprocess
import tempfile
from typing import Any, Dict, Mapping, Sequence, Tuple

import torch

from ._describe import _is_dtensor
from ._dtypes import torch_dtype as _torch_dtype

def _find_tool(name: str) -> str:
    """fsdp-translate and friends: $FSDP_MLIR_BIN_DIR, beside the package, PATH, or the
    repository's build/bin (a source checkout)."""
    try:
        return _fm().find_tool(name)
    except Exception:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = []
    if os.environ.get("FSDP_MLIR_BIN_DIR"):
        candidates.append(os.path.join(os.environ["FSDP_MLIR_BIN_DIR"], name))
    candidates += [os.path.join(here, "bin", name), os.path.join(here, name)]
    on_path = shutil.which(name)
    if on_path:
        candidates.append(on_path)
    repo = os.path.abspath(os.path.join(here, "..", "..", ".."))
    candidates.append(os.path.join(repo, "build", "bin", name))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(f"{name} not found (set FSDP_MLIR_BIN_DIR, put it on PATH, or "
                            "install the fsdp_mlir package with its tools)")


def _load_layout(plan, layout) -> Dict[str, Any]:
    if isinstance(layout, Mapping):
        return dict(layout)
    if layout is not None:
        with open(os.fspath(layout)) as f:
            return json.load(f)
    plan_dir = os.path.dirname(os.path.abspath(os.fspath(plan)))
    for name in ("layout.json",):
        path = os.path.join(plan_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                return json.load(f)
    lowered = os.path.join(plan_dir, "lowered.mlir")
    if os.path.isfile(lowered):
        with tempfile.TemporaryDirectory(prefix="fsdp-layout-") as tmp:
            out = os.path.join(tmp, "layout.json")
            r = subprocess.run([_find_tool("fsdp-translate"), "--emit-layout-json", lowered,
                                "-o", out], capture_output=True, text=True)
            if r.returncode != 0:
                raise ValueError(f"attach: fsdp-translate --emit-layout-json {lowered} failed: "
                                 f"{r.stderr.strip()}")
            with open(out) as f:
                return json.load(f)
    raise ValueError(f"attach: no layout beside the plan {os.fspath(plan)!r} (looked for "
                     "layout.json and lowered.mlir there); pass layout= (a layout JSON path or "
                     "dict from fsdp-translate --emit-layout-json)")


# ---------------------------------------------------------------------------------------------
# errors


def _fm():
    import fsdp_mlir as fm
    return fm


def _make_layout_mismatch():
    try:
        base = _fm().Incompatible
        return type("LayoutMismatch", (base, ValueError), {
            "__doc__": "A model whose packed buffers are not laid out as the plan says.",
            "__module__": "fsdp_mlir.torch"})
    except Exception:  # the extension is not there (describe-only use): a plain ValueError
        return type("LayoutMismatch", (ValueError,), {
            "__doc__": "A model whose packed buffers are not laid out as the plan says.",
            "__module__": "fsdp_mlir.torch"})


LayoutMismatch = _make_layout_mismatch()



def _local(t):
    return t._local_tensor if _is_dtensor(t) else t


class _Member:
    __slots__ = ("fqn", "fqns", "shape", "rows", "row_offset", "local_offset", "row_size",
                 "global_fqns", "expert")

    def __init__(self, entry, rank):
        self.fqn = entry["fqn"]
        self.fqns = [entry["fqn"]] + list(entry.get("tied_fqns", []))
        # A local expert's checkpoint name on each expert-parallel coordinate (experts only).
        self.global_fqns = list(entry["global_fqns"]) if "global_fqns" in entry else None
        self.expert = entry.get("expert")  # {"head", "local", "tail"}
        self.shape = tuple(entry["shape"])
        self.row_size = math.prod(self.shape[1:]) if len(self.shape) > 1 else 1
        self.rows, self.row_offset, self.local_offset = 0, None, 0
        for c in entry["chunks"]:
            if c["rank"] == rank:
                self.rows, self.row_offset = c["rows"], c["row_offset"]
                self.local_offset = c["local_offset"]
                break

    @property
    def local_shape(self):
        return (self.rows,) + self.shape[1:]


class _Group:
    def __init__(self, index, entry, rank):
        self.index = index
        self.unit = entry["unit"]
        self.requires_grad = bool(entry["requires_grad"])
        self.shard_size = int(entry["shard_size"])
        self.roles = {b["role"]: b for b in entry["buffers"]}
        self.members = [_Member(p, rank) for p in entry["params"]]
        self.experts = entry.get("experts")  # {"count", "naming", ...} of an experts group
        rng = [r for r in entry["ranks"] if r["rank"] == rank]
        self.begin = rng[0]["begin"] if rng else None

    def dtype(self, role):
        return _torch_dtype(self.roles[role]["dtype"])

    def where(self):
        return f"group {self.index} (unit {self.unit or '<root>'!r})"


def _as_buffer(t: torch.Tensor, base: int, elements: int, dtype) -> torch.Tensor:
    """The flat buffer of `elements` elements starting at element `base` of t's storage."""
    return torch.empty(0, dtype=dtype, device=t.device).set_(t.untyped_storage(), base,
                                                            (elements,), (1,))


def _find_packed(group: _Group, role: str, tensors: Sequence[Tuple[_Member, Any]],
                 what: str, allow_adopt: bool):
    """Find the one flat buffer all `tensors` (member, tensor-or-DTensor) view, checking each
    sits where the layout says. Returns (buffer or None, "packed" | "adopt" | "none")."""
    dtype = group.dtype(role)
    for m, t in tensors:
        if _is_dtensor(t) and tuple(t.shape) != m.shape:
            raise LayoutMismatch(f"{what} {m.fqn!r} has global shape {tuple(t.shape)}, the plan "
                                 f"says {m.shape}")
    nonempty = [(m, _local(t)) for m, t in tensors if m.rows > 0]
    if not nonempty:
        for m, t in tensors:
            if _local(t).numel() != 0:
                raise LayoutMismatch(
                    f"{what} {m.fqn!r} holds {tuple(_local(t).shape)} on this rank, the plan "
                    f"says this rank holds none of it ({group.where()}, another layout?)")
        return None, "none"
    storages = collections.Counter(l.untyped_storage().data_ptr() for _, l in nonempty)
    if allow_adopt:
        # Separate tensors (as torch.optim allocates its state): not a packed buffer.
        lone = nonempty[0][1]
        if len(storages) > 1 or (lone.untyped_storage().nbytes() <
                                 group.shard_size * lone.element_size()):
            return None, "adopt"
    ptr = storages.most_common(1)[0][0]
    bases = collections.Counter(l.storage_offset() - m.local_offset for m, l in nonempty
                                if l.untyped_storage().data_ptr() == ptr)
    # Offsets count from the start of the storage (a buffer of its own, as Megatron-FSDP
    # allocates it) when any member agrees with that; otherwise (a buffer inside a larger
    # allocation) from where the first member in plan order puts the buffer's start.
    first = next(l.storage_offset() - m.local_offset for m, l in nonempty
                 if l.untyped_storage().data_ptr() == ptr)
    base = 0 if 0 in bases else first
    for m, t in tensors:
        l = _local(t)
        if tuple(l.shape) != m.local_shape:
            raise LayoutMismatch(
                f"{what} {m.fqn!r} is not where the plan puts it: this rank holds "
                f"{tuple(l.shape)} of it, the plan says {m.local_shape} (rows "
                f"[{m.row_offset}, {(m.row_offset or 0) + m.rows}) of {m.shape}); the model was "
                f"packed with another layout ({group.where()}, {role})")
        if m.rows == 0:
            continue
        if l.dtype != dtype:
            raise LayoutMismatch(f"{what} {m.fqn!r} is {l.dtype}, the plan's {role} buffer of "
                                 f"{group.where()} is {dtype}")
        if not l.is_contiguous():
            raise LayoutMismatch(f"{what} {m.fqn!r} is not contiguous: not a view of a packed "
                                 "buffer")
        if l.untyped_storage().data_ptr() != ptr:
            raise LayoutMismatch(f"{what} {m.fqn!r} is not in the same buffer as the other "
                                 f"members of {group.where()} ({role}); the model was packed "
                                 "with another layout")
        if l.storage_offset() - base != m.local_offset:
            raise LayoutMismatch(
                f"{what} {m.fqn!r} is not where the plan puts it: it starts at element "
                f"{l.storage_offset() - base} of this rank's {role} shard of {group.where()}, "
                f"the plan says {m.local_offset}; the model was packed with another layout")
    anyl = nonempty[0][1]
    need = (base + group.shard_size) * anyl.element_size()
    if base < 0 or anyl.untyped_storage().nbytes() < need:
        raise LayoutMismatch(f"the {role} buffer of {group.where()} holding {nonempty[0][0].fqn!r}"
                             f" has {anyl.untyped_storage().nbytes() // anyl.element_size()} "
                             f"elements from the start of its storage; the plan needs "
                             f"{group.shard_size} from element {base}")
    return _as_buffer(anyl, base, group.shard_size, dtype), "packed"


def _rewrap(old, view):
    """A state entry replaced by a view: a DTensor stays a DTensor with the same spec."""
    if _is_dtensor(old):
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(view, old.device_mesh, old.placements, run_check=False,
                                  shape=old.shape, stride=old.stride())
    return view

