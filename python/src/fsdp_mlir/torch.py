"""PyTorch side of fsdp-mlir: describe a model, attach its packed buffers, save and load.

    import fsdp_mlir as fm
    desc = fm.torch.describe(model, units=["layers.0", "layers.1"], mesh={"dp": 4},
                             optimizer=opt, main_grads_dtype="bfloat16")   # fsdp-model-v1 dict
    plan = fm.compile(desc_path, out_dir="out")                             # model.fsdpplan
    fm.torch.attach(sharded_model, opt, plan, comm=dist.group.WORLD)        # once
    fm.torch.save_checkpoint(sharded_model, opt, "ckpt/step-100")
    fm.torch.load_checkpoint(sharded_model, opt, "ckpt/step-100", sync_model_weights=True)

`attach` expects the model Megatron-FSDP leaves after `fully_shard`: every parameter (a tensor,
or a DTensor whose local tensor is used) is a view of this rank's shard of one flat
`main_weight` buffer per parameter group, at the element offset the compiled layout names
(docs/MegatronFSDPLayout.md, docs/LayoutJSON.md), and the optimizer's `exp_avg` /
`exp_avg_sq` are views of buffers with the same layout. It checks every parameter's position
(storage, storage offset, rows of the piece, dtype) against the plan and refuses a model packed
any other way, naming the first parameter that is not where the plan says. Optimizer state that
is missing is created first (the seed's `_init_optimizer_state`: a zero gradient of the
gradient dtype, one step with the learning rate set to 0); optimizer state that lives in
separate tensors (as `torch.optim` allocates it) is moved into packed buffers of the plan's
layout and the optimizer's state entries are replaced by views of them.

Buffers the parameters do not lead to (`model_weight` when it does not alias `main_weight`,
`main_grad` when no gradient is set) can be passed as `buffers={(group, role): tensor}`;
otherwise attach allocates them (the runtime casts `main_weight` into a fresh `model_weight`,
as a load does).
"""

from __future__ import annotations

import ast
import collections
import io
import json
import math
import os
import shutil
import subprocess
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

__all__ = [
    "describe",
    "attach",
    "detach",
    "save_checkpoint",
    "load_checkpoint",
    "attached",
    "attach_uneven_dtensor_metadata",
    "LayoutMismatch",
]

_ATTR = "_fsdp_mlir_attachment"

# ---------------------------------------------------------------------------------------------
# dtypes

_TORCH_TO_SHORT = {
    torch.float64: "f64", torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "bool",
}
_SHORT_TO_TORCH = {v: k for k, v in _TORCH_TO_SHORT.items()}
_NAME_TO_SHORT = {
    "f64": "f64", "float64": "f64", "double": "f64",
    "f32": "f32", "float32": "f32", "float": "f32",
    "bf16": "bf16", "bfloat16": "bf16",
    "f16": "f16", "float16": "f16", "half": "f16",
    "i64": "i64", "int64": "i64", "long": "i64",
    "i32": "i32", "int32": "i32", "int": "i32",
    "i16": "i16", "int16": "i16", "short": "i16",
    "i8": "i8", "int8": "i8",
    "u8": "u8", "uint8": "u8",
    "bool": "bool",
}


def _short_dtype(dtype, what: str) -> str:
    """A torch.dtype or a dtype name -> the model description's short name."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_TO_SHORT:
            raise ValueError(f"{what}: dtype {dtype} has no fsdp-model-v1 name "
                             f"(supported: {', '.join(_NAME_TO_SHORT)})")
        return _TORCH_TO_SHORT[dtype]
    if isinstance(dtype, str):
        name = dtype[6:] if dtype.startswith("torch.") else dtype
        if name in _NAME_TO_SHORT:
            return _NAME_TO_SHORT[name]
    raise ValueError(f"{what}: unknown dtype {dtype!r} (expected a torch.dtype or one of "
                     f"{', '.join(_NAME_TO_SHORT)})")


def _torch_dtype(name: str) -> torch.dtype:
    return _SHORT_TO_TORCH[_short_dtype(name, "dtype")]


# ---------------------------------------------------------------------------------------------
# describe


def _is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without torch.distributed
        return False
    return isinstance(t, DTensor)


def _storage_key(p):
    """What makes two parameters one storage: the same object, or the same memory viewed the
    same way. Meta tensors (a model built without memory) share no storage: identity only."""
    t = p._local_tensor if _is_dtensor(p) else p
    if t.device.type == "meta":
        return ("id", id(p))
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return ("id", id(p))
    if ptr == 0:
        return ("id", id(p))
    return ("mem", t.device.type, t.device.index, ptr, t.storage_offset(), tuple(t.shape),
            tuple(t.stride()), t.dtype)


def _mesh_list(mesh) -> List[Dict[str, Any]]:
    if isinstance(mesh, Mapping):
        items = list(mesh.items())
    elif isinstance(mesh, int):
        items = [("dp", mesh)]
    else:
        items = []
        for axis in mesh:
            if isinstance(axis, Mapping):
                items.append((axis.get("name"), axis.get("size")))
            else:
                name, size = axis
                items.append((name, size))
    out = []
    for name, size in items:
        if not isinstance(name, str) or not name:
            raise ValueError(f"describe: mesh axis names must be non-empty strings, got {name!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"describe: mesh axis {name!r} needs a positive integer size, "
                             f"got {size!r}")
        out.append({"name": name, "size": size})
    if not out:
        raise ValueError("describe: the mesh needs at least one axis")
    return out


def _placements_list(placements, axes: Optional[int]) -> List[str]:
    if isinstance(placements, str):
        placements = [p.strip() for p in placements.split(",")]
    out = [str(p) for p in placements]
    for p in out:
        if p not in ("shard", "replicate"):
            raise ValueError(f"describe: placements are 'shard' or 'replicate', got {p!r}")
    if axes is not None and len(out) != axes:
        raise ValueError(f"describe: {len(out)} placements for a mesh of {axes} axes")
    return out


def _optimizer_dict(optimizer, state_dtype) -> Dict[str, Any]:
    kind = None
    if isinstance(optimizer, torch.optim.AdamW):
        kind = "adamw"
    elif isinstance(optimizer, torch.optim.Adam):
        kind = "adamw" if optimizer.defaults.get("decoupled_weight_decay") else "adam"
    if kind is None:
        raise ValueError(f"describe: optimizer {type(optimizer).__name__} is not supported "
                         "(torch.optim.Adam or torch.optim.AdamW)")
    groups = optimizer.param_groups

    def number(x):
        return float(x.item()) if isinstance(x, torch.Tensor) else float(x)

    def hyper(group):
        return (number(group["lr"]), tuple(number(b) for b in group["betas"]),
                number(group["eps"]), number(group["weight_decay"]))

    first = hyper(groups[0])
    for i, g in enumerate(groups[1:], 1):
        if hyper(g) != first:
            raise ValueError(f"describe: optimizer param group {i} has other hyper-parameters "
                             f"than group 0 ({hyper(g)} vs {first}); a checkpoint holds one "
                             "param group")
    for name in ("amsgrad", "maximize"):
        if any(g.get(name) for g in groups):
            raise ValueError(f"describe: optimizer option {name}=True is not supported "
                             "(exp_avg and exp_avg_sq only)")
    lr, betas, eps, wd = first
    if state_dtype is None:
        state_dtype = "f32"
        for st in optimizer.state.values():
            t = st.get("exp_avg") if isinstance(st, Mapping) else None
            if isinstance(t, torch.Tensor):
                state_dtype = _short_dtype(t.dtype, "optimizer state")
                break
    return {"kind": kind, "lr": lr, "betas": list(betas), "eps": eps, "weight_decay": wd,
            "state_dtype": _short_dtype(state_dtype, "state_dtype")}


def describe(module: torch.nn.Module, units: Iterable = (), mesh=None,
             placements=("shard",), optimizer=None, main_params_dtype="float32",
             main_grads_dtype=None, *, state_dtype=None) -> Dict[str, Any]:
    """The fsdp-model-v1 description (docs/ModelDescription.md) of `module`.

    units: the `fully_shard` modules, as FQNs or module objects; the root is always a unit
    (it owns what no listed unit owns, as a final `fully_shard(model)` does). mesh: {"dp": N}
    (or [("dp_outer", 2), ("dp_shard", 4)], or None to give it at compile time). placements:
    one per mesh axis for every unit. optimizer: a torch.optim.Adam/AdamW whose
    hyper-parameters the checkpoint stores. Tied parameters (one storage under several names)
    carry `tied_to` their first FQN; frozen ones (requires_grad=False) `requires_grad: false`.
    DTensor parameters are described by their global shape. Works on meta-device models.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"describe: expected a torch.nn.Module, got {type(module).__name__}")
    mesh_axes = _mesh_list(mesh) if mesh is not None else None
    placements = _placements_list(placements, len(mesh_axes) if mesh_axes else None)

    fqn_of_module = {}
    for name, m in module.named_modules(remove_duplicate=False):
        fqn_of_module.setdefault(id(m), name)
    unit_fqns = {""}
    for u in units:
        if isinstance(u, torch.nn.Module):
            if id(u) not in fqn_of_module:
                raise ValueError(f"describe: unit {type(u).__name__} is not a submodule of the "
                                 "model")
            unit_fqns.add(fqn_of_module[id(u)])
        elif isinstance(u, str):
            try:
                module.get_submodule(u)
            except AttributeError:
                raise ValueError(f"describe: unit {u!r} is not a submodule of the model") from None
            unit_fqns.add(u)
        else:
            raise TypeError(f"describe: units are module FQNs or modules, got {type(u).__name__}")

    fully_shard = {"placements": list(placements),
                   "main_params_dtype": _short_dtype(main_params_dtype, "main_params_dtype")}
    if main_grads_dtype is not None:
        fully_shard["main_grads_dtype"] = _short_dtype(main_grads_dtype, "main_grads_dtype")

    first_fqn_of_storage: Dict[Any, str] = {}
    seen_modules = set()

    def visit(m: torch.nn.Module, name: str, prefix: str) -> Dict[str, Any]:
        fqn = prefix
        node: Dict[str, Any] = {"name": name}
        if fqn in unit_fqns:
            node["fully_shard"] = dict(fully_shard, placements=list(placements))
        params = []
        for pname, p in m._parameters.items():
            if p is None:
                continue
            pfqn = f"{fqn}.{pname}" if fqn else pname
            shape = list(p.shape)
            if not shape:
                raise ValueError(f"describe: parameter {pfqn!r} is 0-d; fsdp-model-v1 packs "
                                 "parameters by rows (give it shape [1])")
            entry: Dict[str, Any] = {"name": pname, "shape": shape,
                                     "dtype": _short_dtype(p.dtype, f"parameter {pfqn!r}")}
            if not p.requires_grad:
                entry["requires_grad"] = False
            key = _storage_key(p)
            if key in first_fqn_of_storage:
                entry["tied_to"] = first_fqn_of_storage[key]
            else:
                first_fqn_of_storage[key] = pfqn
            params.append(entry)
        if params:
            node["params"] = params
        children = []
        for cname, c in m._modules.items():
            if c is None:
                continue
            if id(c) in seen_modules:
                # A module registered twice: its parameters are tied to the first occurrence.
                pass
            seen_modules.add(id(c))
            children.append(visit(c, cname, f"{fqn}.{cname}" if fqn else cname))
        if children:
            node["children"] = children
        return node

    # Tied parameters must be found in named_parameters() order (own parameters first, then
    # children, depth first): exactly the order of visit().
    root = visit(module, "", "")
    out: Dict[str, Any] = {"format": "fsdp-model-v1"}
    if mesh_axes is not None:
        out["mesh"] = mesh_axes
    if optimizer is not None:
        out["optimizer"] = _optimizer_dict(optimizer, state_dtype)
    out["module"] = root
    return out


# ---------------------------------------------------------------------------------------------
# tools and layout


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
            "__module__": __name__})
    except Exception:  # the extension is not there (describe-only use): a plain ValueError
        return type("LayoutMismatch", (ValueError,), {
            "__doc__": "A model whose packed buffers are not laid out as the plan says.",
            "__module__": __name__})


LayoutMismatch = _make_layout_mismatch()


# ---------------------------------------------------------------------------------------------
# uneven DTensor metadata (the seed's attach_uneven_dtensor_metadata approach)


def attach_uneven_dtensor_metadata(dtensor, row_offset: int):
    """Make DCP save and load `dtensor` as the chunk it really is: rows
    `[row_offset, row_offset + local rows)` of the global tensor, whatever its placements say
    (a packed buffer's pieces are not `torch.chunk` rows). Sets `__create_chunk_list__` and
    `__create_write_items__` on the local tensor, which DTensor forwards to. Returns dtensor."""
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                       TensorProperties)
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    local = dtensor._local_tensor
    offsets = torch.Size([int(row_offset)] + [0] * (local.dim() - 1))
    sizes = torch.Size(local.shape)
    global_size = torch.Size(dtensor.shape)

    def create_chunk_list():
        if local.numel() == 0:
            return []
        return [ChunkStorageMetadata(offsets=offsets, sizes=sizes)]

    def create_write_items(fqn, obj):
        if local.numel() == 0:
            return []
        return [WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                              properties=TensorProperties.create_from_tensor(local),
                              size=global_size))]

    local.__create_chunk_list__ = create_chunk_list
    local.__create_write_items__ = create_write_items
    return dtensor


# ---------------------------------------------------------------------------------------------
# attach


def _local(t):
    return t._local_tensor if _is_dtensor(t) else t


class _Member:
    __slots__ = ("fqn", "fqns", "shape", "rows", "row_offset", "local_offset", "row_size")

    def __init__(self, entry, rank):
        self.fqn = entry["fqn"]
        self.fqns = [entry["fqn"]] + list(entry.get("tied_fqns", []))
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


def _init_optimizer_state(optimizer) -> None:
    """The seed's _init_optimizer_state: when the optimizer has no state, give every trainable
    parameter a zero gradient of its gradient dtype (`grad_dtype`, else its own dtype), take one
    step with the learning rate set to 0 (so no weight moves, weight decay included), restore
    the learning rates and the gradients. A no-op once the state exists.

    A plain torch.optim optimizer cannot step a gradient of another dtype than its parameter
    (Adam's lerp_ refuses bf16 into f32; Megatron-FSDP's optimizer wrapper casts it): then the
    priming is redone with `grad_dtype` set to the parameter's dtype for the step, and restored
    after (what pytorch PR #191998 proposes)."""
    if len(optimizer.state) > 0:
        return
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    saved_grads = [p.grad for p in params]
    saved_grad_dtypes = [getattr(p, "grad_dtype", None) for p in params]
    saved_lrs = [g["lr"] for g in optimizer.param_groups]

    def prime(own_dtype):
        for p, gd in zip(params, saved_grad_dtypes):
            p.grad = None
            if own_dtype and gd is not None and gd != p.dtype:
                p.grad_dtype = p.dtype
            dtype = p.dtype if own_dtype else (gd or p.dtype)
            p.grad = torch.zeros_like(p, dtype=dtype)
        optimizer.step()

    try:
        for g in optimizer.param_groups:
            g["lr"] = torch.zeros_like(g["lr"]) if isinstance(g["lr"], torch.Tensor) else 0.0
        try:
            prime(False)
        except RuntimeError:
            if all(gd is None or gd == p.dtype for p, gd in zip(params, saved_grad_dtypes)):
                raise
            optimizer.state.clear()  # what the failed step created
            prime(True)
    finally:
        for g, lr in zip(optimizer.param_groups, saved_lrs):
            g["lr"] = lr
        for p, grad, gd in zip(params, saved_grads, saved_grad_dtypes):
            p.grad = None
            if gd is not None and getattr(p, "grad_dtype", None) != gd:
                p.grad_dtype = gd
            p.grad = grad


class _Attachment:
    def __init__(self):
        self.checkpointer = None
        self.optimizer = None
        self.groups: List[_Group] = []
        self.params: Dict[str, Any] = {}
        self.buffers: Dict[Tuple[int, str], torch.Tensor] = {}
        self.rank = 0
        self.world_size = 1
        self.plan = None
        self.layout = None


def attached(model) -> Optional[_Attachment]:
    """What attach recorded on the model (None if it was never attached)."""
    return model.__dict__.get(_ATTR)


def _resolve_comm(comm, rank, world_size, layout_world):
    import torch.distributed as dist
    if comm is None and layout_world > 1 and dist.is_available() and dist.is_initialized():
        comm = dist.group.WORLD
    if comm is None:
        return None, (0 if rank is None else rank), (1 if world_size is None else world_size)
    if isinstance(comm, str):
        if rank is None:
            for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK"):
                if var in os.environ:
                    rank = int(os.environ[var])
                    break
        if world_size is None:
            for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"):
                if var in os.environ:
                    world_size = int(os.environ[var])
                    break
        return comm, (0 if rank is None else rank), (layout_world if world_size is None
                                                     else world_size)
    return comm, dist.get_rank(comm), dist.get_world_size(comm)


def attach(model: torch.nn.Module, optimizer, plan, comm=None, *, layout=None,
           buffers: Optional[Mapping[Tuple[int, str], torch.Tensor]] = None,
           rank: Optional[int] = None, world_size: Optional[int] = None):
    """Bind the model's packed buffers to a Checkpointer over `plan` and record it on the model.

    plan: the model.fsdpplan fm.compile returned (its layout is read from layout.json or
    lowered.mlir beside it, or given as layout=). comm: None (a world of one, or the default
    process group when torch.distributed is initialised), "mpi", or a ProcessGroup. Raises
    LayoutMismatch (a ValueError and an fm.Incompatible) naming the first parameter that is not
    where the plan puts it."""
    fm = _fm()
    layout = _load_layout(plan, layout)
    if layout.get("format") != "fsdp-layout-v1":
        raise ValueError("attach: the layout is not an fsdp-layout-v1 document")
    layout_world = math.prod(a["size"] for a in layout["mesh"])
    comm, rank, world_size = _resolve_comm(comm, rank, world_size, layout_world)
    if world_size != layout_world:
        raise ValueError(f"attach: the plan is for {layout_world} ranks, this job has "
                         f"{world_size}")

    att = _Attachment()
    att.rank, att.world_size, att.plan, att.layout = rank, world_size, os.fspath(plan), layout
    att.optimizer = optimizer
    att.groups = [_Group(i, g, rank) for i, g in enumerate(layout["groups"])]

    named = dict(model.named_parameters(remove_duplicate=False))
    planned = set()
    for g in att.groups:
        for m in g.members:
            first = None
            for f in m.fqns:
                planned.add(f)
                if f not in named:
                    raise LayoutMismatch(f"attach: the plan's parameter {f!r} is not a parameter "
                                         "of the model")
                if first is None:
                    first = named[f]
                elif named[f] is not first and _storage_key(named[f]) != _storage_key(first):
                    raise LayoutMismatch(f"attach: {f!r} is tied to {m.fqn!r} in the plan but "
                                         "is a separate tensor in the model")
            att.params[m.fqn] = first
    extra = [f for f in named if f not in planned]
    if extra:
        raise LayoutMismatch(f"attach: model parameter {extra[0]!r} is not in the plan "
                             f"({len(extra)} such)")

    given = dict(buffers or {})
    fresh_model_weights = []
    if optimizer is not None and any(g.requires_grad and "exp_avg" in g.roles
                                     for g in att.groups):
        _init_optimizer_state(optimizer)

    for g in att.groups:
        members = [(m, att.params[m.fqn]) for m in g.members]
        buf, how = _find_packed(g, "main_weight", members, "parameter", allow_adopt=False)
        if buf is None:
            buf = given.get((g.index, "main_weight"))
            if buf is None:
                buf = torch.zeros(g.shard_size, dtype=g.dtype("main_weight"))
        att.buffers[(g.index, "main_weight")] = buf
        found = _megatron_buffers(g, members, buf)
        for key, t in found.items():
            given.setdefault((g.index, key), t)
        mw = g.roles.get("model_weight")
        if mw is not None and mw.get("aliases") != "main_weight":
            t = given.get((g.index, "model_weight"))
            if t is None:
                # A fresh model weight: the runtime casts main_weight into it once bound.
                t = torch.empty(g.shard_size, dtype=g.dtype("model_weight"), device=buf.device)
                fresh_model_weights.append(g.index)
            att.buffers[(g.index, "model_weight")] = t
        if "main_grad" in g.roles:
            t = given.get((g.index, "main_grad"))
            if t is None:
                grads = [(m, p.grad) for m, p in members]
                if all(gr is not None for _, gr in grads):
                    t, how = _find_packed(g, "main_grad", grads, "gradient of", allow_adopt=True)
                    if how != "packed":
                        t = None
            if t is None:
                t = torch.zeros(g.shard_size, dtype=g.dtype("main_grad"))
            att.buffers[(g.index, "main_grad")] = t
        for role in ("exp_avg", "exp_avg_sq"):
            if role in g.roles:
                att.buffers[(g.index, role)] = _state_buffer(att, g, role, given)

    _bind(att, fm, comm)
    for group in fresh_model_weights:
        att.checkpointer.refresh_model_weights(group)
    model.__dict__[_ATTR] = att
    return att.checkpointer


def _megatron_buffers(g: _Group, members, main_weight) -> Dict[str, torch.Tensor]:
    """Megatron-FSDP's own buffers of the group, where its sharded parameters lead to them
    (`_mfsdp_parameter_group`: the FsdpParameterGroup, whose DBuffers' `local_buffer` are this
    rank's shards): model_weight and main_grad, when they have the plan's size and dtype."""
    out = {}
    mgroup = None
    for _, p in members:
        mgroup = getattr(p, "_mfsdp_parameter_group", None)
        if mgroup is not None:
            break
    if mgroup is None:
        return out
    mw = getattr(getattr(mgroup, "main_weight", None), "local_buffer", None)
    if mw is None or main_weight is None or mw.data_ptr() != main_weight.data_ptr():
        return out
    for role, attr in (("model_weight", "model_weight"), ("main_grad", "main_grad")):
        t = getattr(getattr(mgroup, attr, None), "local_buffer", None)
        if (role in g.roles and t is not None and t.numel() == g.shard_size
                and t.dtype == g.dtype(role) and t.is_contiguous()):
            out[role] = t
    return out


def _state_buffer(att, g, role, given):
    if att.optimizer is None:
        raise ValueError(f"attach: the plan has optimizer state ({role} of {g.where()}) but no "
                         "optimizer was given")
    members = []
    for m in g.members:
        p = att.params[m.fqn]
        st = att.optimizer.state.get(p)
        if not st or role not in st:
            raise ValueError(f"attach: the optimizer has no {role} for parameter {m.fqn!r} "
                             "(is it one of the optimizer's parameters?)")
        members.append((m, st[role]))
    buf, how = _find_packed(g, role, members, f"optimizer state {role} of", allow_adopt=True)
    if how == "packed":
        return buf
    buf = given.get((g.index, role))
    if buf is None:
        buf = torch.zeros(g.shard_size, dtype=g.dtype(role),
                          device=_local(members[0][1]).device)
    _adopt(att, g, role, buf)
    return buf


def _adopt(att, g, role, buf):
    """Move the optimizer's `role` tensors of group g into `buf` at the plan's offsets and
    point the optimizer's state at views of it."""
    for m in g.members:
        p = att.params[m.fqn]
        st = att.optimizer.state[p]
        old = st[role]
        view = buf[m.local_offset: m.local_offset + m.rows * m.row_size].view(m.local_shape)
        if m.rows > 0:
            view.copy_(_local(old).reshape(m.local_shape))
        st[role] = _rewrap(old, view)


def _bind(att, fm, comm):
    kwargs = {"rank": att.rank, "world_size": att.world_size, "comm": comm}
    ck = fm.Checkpointer(att.plan, **kwargs)
    info = list(ck.buffers)
    by_group = collections.defaultdict(dict)
    for b in info:
        by_group[b["group"]][b["role"]] = b
    if sorted(by_group) != list(range(len(att.groups))):
        raise ValueError(f"attach: the plan has {len(by_group)} groups, its layout "
                         f"{len(att.groups)}: the layout is not this plan's")
    for g in att.groups:
        roles = by_group[g.index]
        if set(roles) != set(g.roles):
            raise ValueError(f"attach: {g.where()} has buffers {sorted(roles)} in the plan and "
                             f"{sorted(g.roles)} in the layout: the layout is not this plan's")
        for role, b in roles.items():
            if b["elements"] != g.shard_size:
                raise ValueError(f"attach: {g.where()} {role}: the plan says {b['elements']} "
                                 f"elements, the layout {g.shard_size}")
    for b in info:
        if b.get("aliases"):
            continue
        t = att.buffers.get((b["group"], b["role"]))
        if t is None:
            raise ValueError(f"attach: no buffer for group {b['group']} {b['role']}")
        ck.bind(b["group"], b["role"], t)
    att.checkpointer = ck


def detach(model) -> None:
    """Forget what attach recorded (the model and optimizer keep their buffers)."""
    model.__dict__.pop(_ATTR, None)


# ---------------------------------------------------------------------------------------------
# save / load


def _attachment_for(model, optimizer, what) -> _Attachment:
    att = attached(model)
    if att is None:
        raise ValueError(
            f"{what}: the model was never attached: call fsdp_mlir.torch.attach(model, optimizer,"
            " plan, comm) once after sharding it (describing and compiling a Megatron-FSDP model "
            "from its own attributes is not implemented)")
    if optimizer is not att.optimizer:
        raise ValueError(f"{what}: this optimizer is not the one the model was attached with")
    _refresh(att)
    return att


def _refresh(att: _Attachment) -> None:
    """The training loop may have replaced tensors since attach (optimizer.load_state_dict
    copies state into new tensors; assigning param.data moves a parameter): check the
    parameters again and move optimizer state back into the bound buffers."""
    for g in att.groups:
        members = [(m, att.params[m.fqn]) for m in g.members]
        buf, how = _find_packed(g, "main_weight", members, "parameter", allow_adopt=False)
        if how == "packed" and (buf.data_ptr() != att.buffers[(g.index, "main_weight")].data_ptr()):
            raise LayoutMismatch(f"{g.where()}: the parameters moved to another buffer since "
                                 "attach; attach the model again")
        for role in ("exp_avg", "exp_avg_sq"):
            if role not in g.roles:
                continue
            bound = att.buffers[(g.index, role)]
            for m in g.members:
                st = att.optimizer.state.get(att.params[m.fqn])
                if not st or role not in st:
                    raise ValueError(f"optimizer state {role} of {m.fqn!r} is missing since "
                                     "attach")
                l = _local(st[role])
                if m.rows and (l.untyped_storage().data_ptr() != bound.untyped_storage().data_ptr()
                               or l.storage_offset() - bound.storage_offset() != m.local_offset):
                    _adopt(att, g, role, bound)
                    break


def _step_value(att: _Attachment) -> float:
    if att.optimizer is None:
        return 0.0
    for g in att.groups:
        for m in g.members:
            st = att.optimizer.state.get(att.params[m.fqn])
            if st and "step" in st:
                s = st["step"]
                return float(s.item() if isinstance(s, torch.Tensor) else s)
    return 0.0


def save_checkpoint(model: torch.nn.Module, optimizer, checkpoint_dir, *, overwrite=True,
                    async_save=False, **runtime_options):
    """The seed's save_checkpoint: the model's main weights and the optimizer's Adam state as a
    DCP checkpoint, through the runtime bound by attach. Replaces an existing checkpoint
    atomically (overwrite=False refuses to). async_save=True returns the runtime's handle
    (wait() on it) once the buffers may change again. runtime_options (threads, progress,
    buffered_io) go to Checkpointer.save."""
    att = _attachment_for(model, optimizer, "save_checkpoint")
    path = os.fspath(checkpoint_dir)
    step = _step_value(att)
    if async_save:
        return att.checkpointer.save_async(path, overwrite=overwrite, step=step,
                                           **runtime_options)
    att.checkpointer.save(path, overwrite=overwrite, step=step, **runtime_options)
    return None


def _checkpoint_listing(path: str):
    """{key: (file, offset, length)} of the step tensors and {key: value} of the bytes items."""
    steps, values = {}, {}
    try:
        info = _fm().inspect(path)
        for k in info["keys"]:
            key = k["key"]
            if k.get("kind") == "bytes":
                values[key] = k.get("value")
            elif key.startswith("optimizer.state.") and key.endswith(".step") and k["chunks"]:
                c = k["chunks"][0]
                steps[key] = (c["file"], c["offset"], c["length"])
        return steps, values
    except (AttributeError, TypeError, KeyError):
        pass
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    md = FileSystemReader(path).read_metadata()
    for index, info in md.storage_data.items():
        key = index.fqn
        if isinstance(md.state_dict_metadata.get(key), BytesStorageMetadata):
            values[key] = (info.relative_path, info.offset, info.length)
        elif key.startswith("optimizer.state.") and key.endswith(".step"):
            steps[key] = (info.relative_path, info.offset, info.length)
    return steps, values


def _read_item(path, where, parsed=None):
    """One item (a torch.save archive) of a checkpoint, loaded with weights_only=True; items
    with the same bytes (every step of our checkpoints) are parsed once through `parsed`."""
    file, offset, length = where
    with open(os.path.join(path, file), "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if parsed is not None and data in parsed:
        return parsed[data]
    value = torch.load(io.BytesIO(data), weights_only=True)
    if parsed is not None:
        parsed[data] = value
    return value


def _restore_optimizer(att: _Attachment, path: str) -> None:
    if att.optimizer is None:
        return
    steps, values = _checkpoint_listing(path)
    cache, parsed = {}, {}
    for g in att.groups:
        if not g.requires_grad or "exp_avg" not in g.roles:
            continue
        for m in g.members:
            where = steps.get(f"optimizer.state.{m.fqn}.step")
            if where is None:
                continue
            if where not in cache:
                cache[where] = _read_item(path, where, parsed)
            st = att.optimizer.state[att.params[m.fqn]]
            old = st.get("step")
            new = cache[where]
            if isinstance(old, torch.Tensor):
                st["step"] = new.to(dtype=old.dtype, device=old.device).reshape(old.shape).clone()
            else:
                st["step"] = new.clone()
    # The hyper-parameters the checkpoint holds, as set_optimizer_state_dict reinstalls them.
    if len(att.optimizer.param_groups) != 1:
        return
    group = att.optimizer.param_groups[0]
    for name in ("lr", "betas", "eps", "weight_decay"):
        v = values.get(f"optimizer.param_groups.0.{name}")
        if v is None or name not in group:
            continue
        if isinstance(v, tuple) and len(v) == 3 and isinstance(v[0], str):
            try:
                v = _read_item(path, v)
            except Exception:
                continue
        elif isinstance(v, str):
            try:
                v = ast.literal_eval(v)
            except (ValueError, SyntaxError):
                continue
        if isinstance(group[name], torch.Tensor):
            group[name].fill_(float(v))
        else:
            group[name] = v


def load_checkpoint(model: torch.nn.Module, optimizer, checkpoint_dir, *,
                    sync_model_weights: bool = True, **runtime_options) -> None:
    """The seed's load_checkpoint: load any DCP checkpoint of this model (saved on any world
    size: the runtime reshards) into the attached buffers in place, then the optimizer's step
    counts and hyper-parameters; model_weight is refreshed from main_weight unless
    sync_model_weights=False."""
    att = _attachment_for(model, optimizer, "load_checkpoint")
    path = os.fspath(checkpoint_dir)
    att.checkpointer.load(path, sync_model_weights=sync_model_weights, **runtime_options)
    _restore_optimizer(att, path)
