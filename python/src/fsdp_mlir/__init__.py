"""fsdp_mlir: checkpoints of Megatron-FSDP packed buffers in PyTorch DCP
format, from Python (python/README.md).

    import fsdp_mlir as fm
    plan = fm.compile("model.json", out_dir="out", mesh="dp=4", placements="shard")
    ck = fm.Checkpointer(plan, comm=None)      # None, "mpi" or a torch ProcessGroup
    ck.allocate(); ck.fill(7); ck.save("ckpt")
    fm.verify("ckpt"); fm.inspect("ckpt")

`fsdp_mlir.torch` (describe, attach, save_checkpoint, load_checkpoint) is
imported on first use, so `import fsdp_mlir` does not import torch.
"""

import json as _json
import os as _os

from . import _core
from ._checkpointer import Checkpointer, SaveHandle
from ._compile import compile, find_tool
from ._errors import Busy, CheckpointError, Corrupt, Incompatible, IOError_, NotFound
from ._manager import CheckpointManager

__all__ = [
    "Checkpointer", "SaveHandle", "CheckpointManager", "compile", "find_tool", "verify",
    "inspect",
    "export_safetensors",
    "hf_tensors",
    "CheckpointError", "NotFound", "Corrupt", "Incompatible", "IOError_", "Busy",
    "cuda_built", "mpi_built",
]

#: Whether this build has the runtime's CUDA backend (CUDA tensors bind).
cuda_built = bool(_core.cuda_built)
#: Whether this build has MPI (comm="mpi").
mpi_built = bool(_core.mpi_built)


def verify(dir, verdict=False):
    """Checks every byte of the checkpoint in `dir` against its integrity
    index `.fsdp-index`, every item against `.metadata`, and that chunks tile
    each tensor. A checkpoint without the index (PyTorch's own DCP output)
    has only its zip records' CRCs checked: the bytes between records are
    not covered. Returns True, or with verdict=True the line saying which
    ("every byte is covered and matches", or "every record's CRC matches;
    bytes between records are not covered without .fsdp-index"); raises
    Corrupt (or NotFound, ...) naming every problem otherwise."""
    said = _core.verify(_os.fspath(dir))
    return said if verdict else True


def inspect(dir):
    """The keys, shapes, dtypes, chunks and files of the DCP checkpoint in
    `dir`: the dict `fsdp-ckpt inspect --json` prints."""
    return _json.loads(_core.inspect_json(_os.fspath(dir)))


def export_safetensors(dir, out, dtype=None, max_shard_size="5GB", overwrite=False,
                       hf_config=None):
    """Writes the model of the checkpoint in `dir` (ours, PyTorch's,
    Megatron-FSDP's) as Hugging Face safetensors into the directory `out`:
    `model.safetensors`, or `model-0000i-of-0000n.safetensors` shards of at
    most `max_shard_size` tensor bytes ("5GB" = 5e9, "2GiB" = 2^30) with
    `model.safetensors.index.json`. Tensor names are the FQNs (the `model.`
    prefix dropped); `dtype` ("bf16", "f16", "f32") casts floating tensors.
    One tensor at a time, every item checked; `out` appears whole or not at
    all. `hf_config`, a Hugging Face model directory (a hub snapshot too),
    has its config.json (required), generation_config.json and tokenizer
    files copied in, so that transformers' from_pretrained(out) loads it
    (regular files only, each at most 256 MiB). overwrite=True keeps the
    replaced export's other plain files (config.json, ...) unless hf_config
    brings files of those names. Returns {"tensors", "bytes",
    "largest_tensor_bytes", "files", "config_files", "seconds"}."""
    return _core.export_safetensors(_os.fspath(dir), _os.fspath(out), dtype or "",
                                    str(max_shard_size), bool(overwrite),
                                    "" if hf_config is None else _os.fspath(hf_config))


def hf_tensors(dir):
    """The tensors of the Hugging Face model directory `dir` (model.safetensors, or the shards
    model.safetensors.index.json names), every header checked as a load checks it: {name:
    (dtype, shape, file)}."""
    return {name: (dtype, tuple(shape), file)
            for name, (dtype, shape, file) in _core.hf_tensors(_os.fspath(dir)).items()}


def __getattr__(name):
    # fsdp_mlir.torch, imported on first use (it imports torch).
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'fsdp_mlir' has no attribute {name!r}")
