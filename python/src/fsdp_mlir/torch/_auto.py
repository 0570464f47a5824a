"""The drop-in path: a model that was never attached is described from what its framework
recorded on it (units, mesh, placements, dtypes), compiled once into a cache keyed by a hash of
the description, and attached."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

from ._describe import describe
from .adapters import find as find_adapter


def cache_root() -> str:
    """$FSDP_MLIR_CACHE, else ~/.cache/fsdp-mlir/plans."""
    root = os.environ.get("FSDP_MLIR_CACHE")
    if not root:
        root = os.path.join(os.path.expanduser("~"), ".cache", "fsdp-mlir", "plans")
    return root


def _compile_into(desc, final: str) -> None:
    """Compiles into a fresh directory beside `final`, then renames it into place (another
    process doing the same wins the race harmlessly)."""
    import fsdp_mlir as fm
    os.makedirs(os.path.dirname(final), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(final) + ".tmp-", dir=os.path.dirname(final))
    try:
        with open(os.path.join(tmp, "model.json"), "w") as f:
            json.dump(desc, f, sort_keys=True)
        fm.compile(os.path.join(tmp, "model.json"), out_dir=tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isfile(os.path.join(final, "model.fsdpplan")):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def compiled_plan(desc) -> str:
    """The plan of `desc` from the cache, compiled on first use. Under torch.distributed the
    first rank compiles while the others wait; every rank gets the same error if it fails."""
    import torch
    import torch.distributed as dist
    text = json.dumps(desc, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()[:24]
    final = os.path.join(cache_root(), key)
    plan = os.path.join(final, "model.fsdpplan")
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    error = None
    if not os.path.isfile(plan) and (not distributed or dist.get_rank() == 0):
        try:
            _compile_into(desc, final)
        except Exception as e:  # reported on every rank below
            error = e
    if distributed:
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        failed = torch.tensor([0 if error is None else 1], device=device)
        dist.all_reduce(failed)
        if int(failed.item()):
            if error is not None:
                raise error
            raise RuntimeError("compiling the model's plan failed on rank 0 (see its error)")
        if not os.path.isfile(plan):  # a cache that is not shared between nodes
            _compile_into(desc, final)
    elif error is not None:
        raise error
    return plan


def attach_from_model(model, optimizer, what: str):
    from ._attach import attach, attached
    adapter = find_adapter(model)
    why = adapter.refuse(model)
    if why:
        raise ValueError(f"{what}: {why}")
    options = adapter.describe_options(model, optimizer)
    if options is None:
        raise ValueError(
            f"{what}: the model was never attached and its framework ({adapter.name}) does not "
            "record its units and mesh: describe it (fm.torch.describe), compile it "
            "(fm.compile) and call fm.torch.attach(model, optimizer, plan, comm) once")
    desc = describe(model, optimizer=optimizer, **options)
    if "optimizer" in desc:
        # Hyper-parameters are live (every save writes the optimizer's own): the plan needs only
        # which state the optimizer keeps, so an LR schedule never changes the cache key.
        # `state` (checked against amsgrad / momentum) decides the buffers; a nonzero momentum
        # is kept as 1, so a momentum schedule does not either.
        opt = desc["optimizer"]
        kept = {k: opt[k] for k in ("kind", "state_dtype", "amsgrad", "state") if k in opt}
        if opt.get("momentum"):
            kept["momentum"] = 1.0
        desc["optimizer"] = kept
    attach(model, optimizer, compiled_plan(desc))
    return attached(model)
