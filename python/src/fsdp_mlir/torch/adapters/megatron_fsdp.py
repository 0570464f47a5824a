"""Megatron-FSDP's experimental `fully_shard` (megatron-fsdp 0.6.x from PyPI).

Each sharded parameter is a DTensor view of its FsdpParameterGroup's `main_weight` DBuffer and
carries the group as `_mfsdp_parameter_group` (a strong reference in 0.6.x). Units are the
modules that are FsdpModule instances; each group records its mesh, placements and dtypes
(main_weight: main_params_dtype; main_grad: main_grads_dtype; `dtype`: the model's). The
group's own `sync_model_weight_from_main_weight` refreshes the compute weights (its optimizer
hook runs it after every step). A mixture of experts shards its experts modules on a sub-mesh of
an expert view (`fully_shard(experts, view["edp"], ...)`): the view's axes and the one axis the
sub-mesh lacks (expert parallelism) describe them (docs/Experts.md).
"""

from __future__ import annotations

import math

from typing import Any, Dict, List, Optional

from . import Adapter

ATTR = "_mfsdp_parameter_group"


def _fsdp_module_class():
    try:
        from megatron_fsdp.experimental.module import FsdpModule
    except Exception:  # not installed, or an import this machine cannot do
        return None
    return FsdpModule


class MegatronFSDP(Adapter):
    name = "Megatron-FSDP"

    @staticmethod
    def parameter_group(p):
        """The FsdpParameterGroup a sharded parameter belongs to (None: not Megatron's)."""
        return getattr(p, ATTR, None)

    @classmethod
    def detect(cls, model) -> bool:
        return any(cls.parameter_group(p) is not None for p in model.parameters())

    @staticmethod
    def sharded_parameters(group):
        """The group's sharded parameters (the ones the model and optimizer hold)."""
        return tuple(group.sharded_parameters)

    def _group(self, params: List[Any]):
        for p in params:
            g = self.parameter_group(p)
            if g is not None:
                return g
        return None

    def framework_buffers(self, params: List[Any]) -> Dict[str, Any]:
        group = self._group(params)
        if group is None:
            return {}
        out: Dict[str, Any] = {}
        main = getattr(group, "main_weight", None)
        if main is None:
            return {}
        out["main_weight"] = main.local_buffer
        mw = getattr(group, "model_weight", None)
        # A model weight laid out as the main weight is the plan's model_weight; one with other
        # placements (replicated compute weights) is refreshed by the framework's own sync.
        if mw is not None and mw is not main and list(mw.placements) == list(main.placements):
            out["model_weight"] = mw.local_buffer
        grad = getattr(group, "main_grad", None)
        if grad is not None and list(grad.placements) == list(main.placements):
            out["main_grad"] = grad.local_buffer
        return out

    def sync_model_weights(self, params: List[Any]) -> bool:
        group = self._group(params)
        sync = getattr(group, "sync_model_weight_from_main_weight", None)
        if sync is None:
            return False
        sync()
        return True

    def describe_options(self, model, optimizer) -> Optional[Dict[str, Any]]:
        cls = _fsdp_module_class()
        units, groups, owner = [], [], {}
        for name, m in model.named_modules():
            owned = [g for g in getattr(m, "_parameter_groups", ()) or ()]
            is_unit = (cls is not None and isinstance(m, cls)) or bool(owned)
            if is_unit and name:
                units.append(name)
            groups += owned
            for g in owned:
                owner.setdefault(id(g), name)
        if not groups:
            for p in model.parameters():
                g = self.parameter_group(p)
                if g is not None and all(g is not h for h in groups):
                    groups.append(g)
        if not groups:
            return None
        # Every rank sees the same groups and meshes, so every rank refuses alike (no
        # collective waits on a rank that raised).
        if len({_mesh_key(g.mesh) for g in groups}) == 1 and _covers_world(groups[0].mesh):
            # One mesh for every unit (possibly a slice of a bigger one, as HSDP takes it).
            views = {id(g): None for g in groups}
        else:
            views = {id(g): _expert_view(g) for g in groups}
        world_groups = [g for g in groups if views[id(g)] is None]
        expert_groups = [g for g in groups if views[id(g)] is not None]
        if not world_groups:
            raise ValueError(
                f"only experts ({_names(expert_groups[0])}) are sharded, on a sub-mesh of "
                f"{_mesh_text(_root_mesh(expert_groups[0].mesh))}: fully_shard the model on the "
                "world's mesh too, as Megatron-FSDP's MoE recipe does")
        first = world_groups[0]
        world_axes = [(n, int(s)) for n, s in zip(_axis_names(first.mesh), first.mesh.shape)]
        for g in world_groups:
            if _mesh_key(g.mesh) != _mesh_key(first.mesh):
                raise ValueError(
                    f"parameters {_names(g)} are sharded on {_mesh_text(g.mesh)}, the model's "
                    f"other parameters on {_mesh_text(first.mesh)}: one mesh for every unit, "
                    "or experts on a sub-mesh of an expert view (docs/Experts.md)")
        options: Dict[str, Any] = {}
        if expert_groups:
            options["experts"] = _experts_option(expert_groups, views, owner, world_axes)
        placements = [_placement_name(p) for p in first.main_weight.placements]
        trainable = [g for g in groups if g.main_grad is not None]
        param_dtypes = {}
        sharded = {id(p): g for g in groups for p in self.sharded_parameters(g)}
        for fqn, p in model.named_parameters(remove_duplicate=False):
            g = sharded.get(id(p)) or self.parameter_group(p)
            if g is not None:
                param_dtypes[fqn] = g.dtype
        options.update({
            "units": units,
            "mesh": world_axes,
            "placements": placements,
            "main_params_dtype": first.main_weight.dtype,
            "main_grads_dtype": trainable[0].main_grad.dtype if trainable else None,
            "param_dtypes": param_dtypes,
        })
        return options


def _mesh_key(mesh):
    return (tuple(int(s) for s in mesh.shape), tuple(mesh.mesh_dim_names or ()))


def _axis_names(mesh):
    return mesh.mesh_dim_names or tuple(f"dp{i}" for i in range(mesh.ndim))


def _mesh_text(mesh) -> str:
    return str(dict(zip(_axis_names(mesh), (int(s) for s in mesh.shape))))


def _names(group) -> List[str]:
    return list(group.parameter_names)[:2]


def _covers_world(mesh) -> bool:
    import torch.distributed as dist
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    return world is None or int(mesh.mesh.numel()) == world


def _root_mesh(mesh):
    get = getattr(mesh, "_get_root_mesh", None)
    root = get() if get is not None else None
    return mesh if root is None else root


def _expert_view(group) -> Optional[Dict[str, Any]]:
    """For a group sharded on a sub-mesh of a bigger named mesh (Megatron-FSDP's experts on
    `view["edp"]`): {"mesh": the view's axes, "expert_axis": the one axis the sub-mesh lacks}.
    None for a group on a mesh of its own (the world's). Refuses views docs/Experts.md cannot
    express: more than one missing axis, axes out of order, ranks not numbered row-major."""
    mesh = group.mesh
    root = _root_mesh(mesh)
    if root is mesh or root.ndim <= mesh.ndim:
        return None
    names, sub = tuple(root.mesh_dim_names or ()), tuple(mesh.mesh_dim_names or ())
    where = f"parameters {_names(group)} are sharded on {_mesh_text(mesh)}, a sub-mesh of " \
            f"{_mesh_text(root)}"
    if not names or not sub or any(n not in names for n in sub):
        raise ValueError(f"{where}, without axis names: name the expert view's axes "
                         "(init_device_mesh(..., mesh_dim_names=...))")
    rest = [n for n in names if n not in sub]
    if len(rest) != 1 or [n for n in names if n in sub] != list(sub):
        raise ValueError(f"{where}: an experts' mesh is its view without exactly one axis, "
                         f"the expert-parallel one, in the view's order (it lacks {rest}); "
                         "describe the model by hand (docs/Experts.md)")
    flat = [int(r) for r in root.mesh.flatten().tolist()]
    if flat != list(range(len(flat))):
        raise ValueError(f"{where}, whose ranks are not numbered row-major from 0 "
                         f"({flat[:8]}...): an expert view orders world ranks as "
                         "init_device_mesh does (docs/Experts.md)")
    return {"mesh": [(n, int(s)) for n, s in zip(names, root.shape)], "expert_axis": rest[0]}


def _experts_option(groups, views, owner, world_axes) -> Dict[str, Any]:
    """describe()'s `experts` argument for the groups sharded on an expert view."""
    first = groups[0]
    view = views[id(first)]
    placements = [_placement_name(p) for p in first.main_weight.placements]
    units = []
    for g in groups:
        if views[id(g)] != view:
            raise ValueError(
                f"experts {_names(g)} and {_names(first)} are sharded on different expert views "
                f"({views[id(g)]['mesh']} and {view['mesh']}): one expert view per model")
        if [_placement_name(p) for p in g.main_weight.placements] != placements:
            raise ValueError(f"experts {_names(g)} and {_names(first)} have different placements:"
                             " one set for every experts unit")
        unit = owner.get(id(g))
        if unit is None or unit == "":
            raise ValueError(f"experts {_names(g)} are not owned by a submodule (the model's root "
                             "cannot be an experts unit)")
        if unit not in units:
            units.append(unit)
    if math.prod(s for _, s in view["mesh"]) != math.prod(s for _, s in world_axes):
        raise ValueError(f"the expert view {view['mesh']} does not cover the model's mesh "
                         f"{world_axes}: their sizes differ")
    return dict(view, units=units, placements=placements)


def _placement_name(placement) -> str:
    kind = type(placement).__name__
    if kind == "Flat":
        return "shard"
    if kind == "Replicate":
        return "replicate"
    raise ValueError(f"Megatron-FSDP placement {placement!r} has no fsdp-model-v1 name "
                     "(Flat is 'shard', Replicate 'replicate')")
