"""Megatron-FSDP main (Megatron-LM's megatron_fsdp, newer than 0.6.x): a sharded parameter keeps
its FsdpParameterGroup as a `weakref.ref` in `_mfsdp_parameter_group`, and the group replaces its
`model_weight` DBuffer with a new one at every optimizer step. Nothing of it may be kept from one
call to the next; this adapter dereferences the marker each time it is asked. Checked by hand
against Megatron-LM d98e8a64 (August 2026) on CPU: resumed training bit-identical to the run
that never stopped, saving with either module and loading with the other."""

from __future__ import annotations

import weakref

from .megatron_fsdp import ATTR, MegatronFSDP


class MegatronFSDPMain(MegatronFSDP):
    name = "Megatron-FSDP (main)"

    @staticmethod
    def parameter_group(p):
        ref = getattr(p, ATTR, None)
        if isinstance(ref, weakref.ref):
            group = ref()
            if group is None:
                raise ValueError("a parameter's Megatron-FSDP parameter group is gone (its "
                                 "weak reference is dead): the model was re-sharded?")
            return group
        return None

    @staticmethod
    def sharded_parameters(group):
        """main keeps FsdpParameter(fqns, sharded, unsharded) records in `fsdp_parameters`."""
        records = getattr(group, "fsdp_parameters", None)
        if records is None:  # a 0.6.x group behind a weak reference (the test double)
            return tuple(group.sharded_parameters)
        return tuple(r.sharded for r in records)

    @classmethod
    def detect(cls, model) -> bool:
        return any(isinstance(getattr(p, ATTR, None), weakref.ref) for p in model.parameters())
