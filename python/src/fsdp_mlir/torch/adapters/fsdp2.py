"""torch FSDP2 (`torch.distributed.fsdp.fully_shard`): each parameter is its own Shard(0)
DTensor, not a view of a packed buffer, so there is nothing for a plan to bind. Its checkpoints
are plain DCP ones: fsdp-ckpt reshard / Checkpointer.load read them into a packed layout."""

from . import Adapter


class FSDP2(Adapter):
    name = "torch FSDP2"

    @staticmethod
    def detect(model) -> bool:
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # pragma: no cover - older torch
            return False
        return any(isinstance(m, FSDPModule) for m in model.modules())

    def refuse(self, model):
        return ("the model is sharded with torch FSDP2 (fully_shard from torch.distributed.fsdp):"
                " its parameters are Shard(0) chunks in separate tensors, not packed buffers; save "
                "it with torch.distributed.checkpoint and load that with fsdp-ckpt reshard or "
                "fm.Checkpointer.load")
