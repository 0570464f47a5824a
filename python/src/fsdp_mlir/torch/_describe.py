"""describe: the fsdp-model-v1 description (docs/ModelDescription.md) of a torch module."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional

import torch

from ._dtypes import short_dtype as _short_dtype

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
    from . import _optim
    try:
        out = _optim.description(optimizer, state_dtype)
    except ValueError as e:
        raise ValueError(f"describe: {e}") from None
    out["state_dtype"] = _short_dtype(out["state_dtype"], "state_dtype")
    return out


def _local_expert_count(unit: torch.nn.Module, fqn: str, naming: str) -> int:
    """How many local experts `unit` holds: local_experts' children, or the distinct numbers
    its grouped parameters' names end with."""
    if naming == "local_experts":
        return len(unit.local_experts) if hasattr(unit, "local_experts") else 0
    numbers = set()
    for name, _ in unit.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        digits = len(leaf) - len(leaf.rstrip("0123456789"))
        if digits:
            numbers.add(int(leaf[-digits:]))
    return len(numbers)


def _expert_units(module, experts, fqn_of_module) -> Dict[str, Dict[str, Any]]:
    """{unit fqn: its "experts" entry} for describe's `experts` argument."""
    if not isinstance(experts, Mapping) or "mesh" not in experts:
        raise ValueError("describe: experts needs {'mesh': [(axis, size), ...], ...} with the "
                         "expert-parallel axis last (or named by 'expert_axis')")
    unknown = set(experts) - {"mesh", "expert_axis", "units", "count", "naming", "placements"}
    if unknown:
        raise ValueError(f"describe: unknown experts keys {sorted(unknown)}")
    axes = _mesh_list(experts["mesh"])
    if len(axes) < 2:
        raise ValueError("describe: the expert mesh needs a data-parallel axis besides the "
                         "expert-parallel one")
    axis = experts.get("expert_axis", axes[-1]["name"])
    sizes = {a["name"]: a["size"] for a in axes}
    if axis not in sizes:
        raise ValueError(f"describe: expert_axis {axis!r} is not an axis of the expert mesh")
    units = experts.get("units")
    if units is None:  # Megatron's convention: the modules named `experts`
        fqns = [name for name, m in module.named_modules() if name.rsplit(".", 1)[-1] == "experts"]
    else:
        fqns = []
        for u in units:
            if isinstance(u, torch.nn.Module):
                if id(u) not in fqn_of_module:
                    raise ValueError("describe: an experts unit is not a submodule of the model")
                fqns.append(fqn_of_module[id(u)])
            else:
                fqns.append(str(u))
    if not fqns:
        raise ValueError("describe: experts given but no module is named 'experts' (pass "
                         "experts={'units': [...]})")
    placements = _placements_list(experts.get("placements", ["shard"] * (len(axes) - 1)),
                                  len(axes) - 1)
    out = {}
    for fqn in fqns:
        try:
            unit = module.get_submodule(fqn)
        except AttributeError:
            raise ValueError(f"describe: experts unit {fqn!r} is not a submodule") from None
        naming = experts.get("naming") or (
            "local_experts" if hasattr(unit, "local_experts") else "grouped")
        count = experts.get("count")
        if count is None:
            count = _local_expert_count(unit, fqn, naming) * sizes[axis]
        out[fqn] = {"placements": placements,
                    "experts": {"mesh": "experts", "count": int(count), "naming": naming}}
    return {"axes": axes, "expert_axis": axis, "units": out}


def describe(module: torch.nn.Module, units: Iterable = (), mesh=None,
             placements=("shard",), optimizer=None, main_params_dtype="float32",
             main_grads_dtype=None, *, state_dtype=None,
             param_dtypes: Optional[Mapping[str, Any]] = None,
             experts: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The fsdp-model-v1 description (docs/ModelDescription.md) of `module`.

    units: the `fully_shard` modules, as FQNs or module objects; the root is always a unit
    (it owns what no listed unit owns, as a final `fully_shard(model)` does). mesh: {"dp": N}
    (or [("dp_outer", 2), ("dp_shard", 4)], or None to give it at compile time). placements:
    one per mesh axis for every unit. optimizer: a torch.optim.Adam, AdamW or SGD whose
    hyper-parameters the checkpoint stores and whose state tensors the plan holds. Tied
    parameters (one storage under several names) carry `tied_to` their first FQN; frozen ones
    (requires_grad=False) `requires_grad: false`.
    DTensor parameters are described by their global shape. Works on meta-device models.
    param_dtypes: {fqn: dtype} for parameters whose tensor is not of the model's dtype (after
    Megatron-FSDP's fully_shard a parameter is its f32 main weight; the model dtype is that of
    its compute weight).
    experts: a mixture of experts (docs/Experts.md): {"mesh": [("edp", 2), ("ep", 4)]} views
    the world as the experts' mesh, the expert-parallel axis last (or "expert_axis"); every
    module named `experts` (or "units": [...]) becomes a unit sharded on it ("placements",
    default shard), holding this rank's local experts; "count" (default: local experts x EP)
    and "naming" ("grouped" or "local_experts", found from the module) describe them.
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

    expert_spec = _expert_units(module, experts, fqn_of_module) if experts is not None else None
    if expert_spec:
        unit_fqns.update(expert_spec["units"])

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
        if expert_spec and fqn in expert_spec["units"]:
            spec = expert_spec["units"][fqn]
            node["fully_shard"]["placements"] = list(spec["placements"])
            node["experts"] = dict(spec["experts"])
        params = []
        for pname, p in m._parameters.items():
            if p is None:
                continue
            pfqn = f"{fqn}.{pname}" if fqn else pname
            shape = list(p.shape)
            if not shape:
                raise ValueError(f"describe: parameter {pfqn!r} is 0-d; fsdp-model-v1 packs "
                                 "parameters by rows (give it shape [1])")
            dtype = (param_dtypes or {}).get(pfqn, p.dtype)
            entry: Dict[str, Any] = {"name": pname, "shape": shape,
                                     "dtype": _short_dtype(dtype, f"parameter {pfqn!r}")}
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
    if expert_spec:
        out["expert_meshes"] = [{"name": "experts", "axes": expert_spec["axes"],
                                 "experts": expert_spec["expert_axis"]}]
    if optimizer is not None:
        out["optimizer"] = _optimizer_dict(optimizer, state_dtype)
    out["module"] = root
    return out

