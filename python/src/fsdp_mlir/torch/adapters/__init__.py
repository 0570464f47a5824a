"""Training frameworks behind one small interface: what fsdp_mlir.torch needs of each.

An adapter is looked up for a model at every save and load (`find(model)`); it holds nothing
between calls, so a framework that frees or replaces its buffers is always seen as it is now.
One file per framework: megatron_fsdp (0.6.x: a strong reference to the parameter group, a
cast in place), megatron_fsdp_main (a weak reference, model_weight replaced at every step),
fsdp2 (refused with the reason), packed (tensors packed by hand, the generic case).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional


class Adapter:
    """The generic case: parameters that are views of packed buffers, nothing else known."""

    name = "packed tensors"

    @staticmethod
    def detect(model) -> bool:
        return True

    def refuse(self, model) -> Optional[str]:
        """Why this framework's models cannot be attached (None: they can)."""
        return None

    def describe_options(self, model, optimizer) -> Optional[Dict[str, Any]]:
        """describe()'s keyword arguments read from the model alone (units, mesh, placements,
        dtypes), or None when the framework does not record them (then the model must be
        described and attached by hand)."""
        return None

    def framework_buffers(self, params: List[Any]) -> Dict[str, Any]:
        """The buffers of one parameter group that the framework owns now, by role
        (model_weight, main_grad, main_weight), found from the group's parameters."""
        return {}

    def sync_model_weights(self, params: List[Any]) -> bool:
        """Refreshes the compute weights of one group from its main weights through the
        framework's own sync; False when it has none (the runtime's cast is used)."""
        return False


def find(model) -> Adapter:
    from . import fsdp2, megatron_fsdp, megatron_fsdp_main, packed
    for cls in (megatron_fsdp_main.MegatronFSDPMain, megatron_fsdp.MegatronFSDP,
                fsdp2.FSDP2, packed.Packed):
        if cls.detect(model):
            return cls()
    return Adapter()  # pragma: no cover - Packed detects everything
