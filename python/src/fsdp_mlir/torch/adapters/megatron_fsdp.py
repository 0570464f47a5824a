"""Megatron-FSDP's experimental `fully_shard` (megatron-fsdp 0.6.x from PyPI).

Each sharded parameter is a DTensor view of its FsdpParameterGroup's `main_weight` DBuffer and
carries the group as `_mfsdp_parameter_group` (a strong reference in 0.6.x). Units are the
modules that are FsdpModule instances; each group records its mesh, placements and dtypes
(main_weight: main_params_dtype; main_grad: main_grads_dtype; `dtype`: the model's). The
group's own `sync_model_weight_from_main_weight` refreshes the compute weights (its optimizer
hook runs it after every step).
"""

from __future__ import annotations

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
        units, groups = [], []
        for name, m in model.named_modules():
            owned = [g for g in getattr(m, "_parameter_groups", ()) or ()]
            is_unit = (cls is not None and isinstance(m, cls)) or bool(owned)
            if is_unit and name:
                units.append(name)
            groups += owned
        if not groups:
            for p in model.parameters():
                g = self.parameter_group(p)
                if g is not None and all(g is not h for h in groups):
                    groups.append(g)
        if not groups:
            return None
        first = groups[0]
        mesh = first.mesh
        names = mesh.mesh_dim_names or tuple(f"dp{i}" for i in range(mesh.ndim))
        for g in groups:
            # Every rank sees the same groups, so every rank refuses alike (no collective waits).
            if (tuple(g.mesh.shape), g.mesh.mesh_dim_names) != (tuple(mesh.shape),
                                                                 mesh.mesh_dim_names):
                raise ValueError(
                    f"parameters {list(g.parameter_names)[:2]} are sharded on a mesh of their own "
                    f"({dict(zip(g.mesh.mesh_dim_names or (), g.mesh.shape))}, the model's is "
                    f"{dict(zip(names, mesh.shape))}): experts on an expert-data-parallel "
                    "mesh are not described automatically; describe the model with "
                    "fm.torch.describe(..., experts={'mesh': [...]}), compile and attach it "
                    "(docs/Experts.md)")
        placements = [_placement_name(p) for p in first.main_weight.placements]
        trainable = [g for g in groups if g.main_grad is not None]
        param_dtypes = {}
        sharded = {id(p): g for g in groups for p in self.sharded_parameters(g)}
        for fqn, p in model.named_parameters(remove_duplicate=False):
            g = sharded.get(id(p)) or self.parameter_group(p)
            if g is not None:
                param_dtypes[fqn] = g.dtype
        return {
            "units": units,
            "mesh": [(n, int(s)) for n, s in zip(names, mesh.shape)],
            "placements": placements,
            "main_params_dtype": first.main_weight.dtype,
            "main_grads_dtype": trainable[0].main_grad.dtype if trainable else None,
            "param_dtypes": param_dtypes,
        }


def _placement_name(placement) -> str:
    kind = type(placement).__name__
    if kind == "Flat":
        return "shard"
    if kind == "Replicate":
        return "replicate"
    raise ValueError(f"Megatron-FSDP placement {placement!r} has no fsdp-model-v1 name "
                     "(Flat is 'shard', Replicate 'replicate')")
