"""PyTorch side of fsdp-mlir: describe a model, attach its packed buffers, save and load.

    import fsdp_mlir as fm
    fm.torch.save_checkpoint(model, opt, "ckpt/step-100", extra={"lr_scheduler": sched})
    fm.torch.load_checkpoint(model, opt, "ckpt/step-100", extra={"lr_scheduler": sched})
    fm.torch.load_pretrained(model, "llama-hf/", opt)  # a Hugging Face model, to fine-tune

A Megatron-FSDP `fully_shard`-ed model needs nothing else: the first save or load describes it
from its own attributes, compiles the plan (cached by a hash of the description) and attaches
it. Any other model packed the same way is described and attached by hand:

    desc = fm.torch.describe(model, units=["layers.0", "layers.1"], mesh={"dp": 4},
                             optimizer=opt, main_grads_dtype="bfloat16")  # fsdp-model-v1 dict
    plan = fm.compile(desc, out_dir="out")                                # model.fsdpplan
    fm.torch.attach(model, opt, plan, comm=dist.group.WORLD)              # once

Modules: _describe (the description), _layout (the compiled layout and the packed-buffer
check), _attach (binding, looked up again at every call), _optim (optimizer state and live
param groups), _state (live items: extra state, RNG), _checkpoint (save/load), _auto (the
drop-in path), adapters/ (one file per training framework).
"""

from ._attach import attach, attached, detach
from ._checkpoint import load_checkpoint, load_pretrained, save_checkpoint
from ._describe import describe
from ._layout import LayoutMismatch
from ._state import PerRank, RNGState
from ._uneven import attach_uneven_dtensor_metadata

__all__ = [
    "describe",
    "attach",
    "detach",
    "save_checkpoint",
    "load_checkpoint",
    "load_pretrained",
    "attached",
    "attach_uneven_dtensor_metadata",
    "LayoutMismatch",
    "PerRank",
    "RNGState",
]
