"""Megatron-FSDP main (Megatron-LM's megatron_fsdp, newer than 0.6.x): a sharded parameter keeps
its FsdpParameterGroup as a `weakref.ref` in `_mfsdp_parameter_group`, and the group replaces its
`model_weight` DBuffer with a new one at every optimizer step. Nothing of it may be kept from one
call to the next; this adapter dereferences the marker each time it is asked."""

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

    @classmethod
    def detect(cls, model) -> bool:
        return any(isinstance(getattr(p, ATTR, None), weakref.ref) for p in model.parameters())
