"""save_checkpoint / load_checkpoint: the seed's API over the runtime.

Static and live: the plan decides the tensors (keys, shapes, chunks, where bytes live); what
training changes is taken at each save as live items: every param group's every key as the
optimizer's state dict has it (`optimizer.param_groups.<i>.<key>`, `params` as FQNs), and the
job's other state (`extra=`). A load restores all of it, and refreshes the compute weights the
framework reads now.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

import torch

from . import _auto, _optim, _state
from ._attach import _Attachment, attached, give_loaded_state, resolve
from ._layout import _fm

_PARAM_GROUPS = "optimizer.param_groups."


def _attachment_for(model, optimizer, what) -> _Attachment:
    att = attached(model)
    if att is None:
        att = _auto.attach_from_model(model, optimizer, what)
    if optimizer is not att.optimizer:
        raise ValueError(f"{what}: this optimizer is not the one the model was attached with")
    resolve(model, att, what)
    return att


def _live_items(att: _Attachment, extra, with_optimizer=True) -> List[_state.Item]:
    """This save's live items, on the committing rank (others: what they must send there)."""
    ck = att.checkpointer
    items: List[_state.Item] = []
    if att.optimizer is not None and with_optimizer:
        groups = _optim.param_groups_state(att.optimizer, att.fqn_of, att.checkpoint_param_names)
        items += _state.to_items({"optimizer": {"param_groups": groups}})
    shared, mine = _state.extra_items(extra, att.rank)
    if att.world_size > 1 and _has_per_rank(extra):
        mine = _state.gather_to(ck.commit_rank, mine, _process_group(att))
    return items + shared + mine if att.rank == ck.commit_rank else []


def _agree(att: _Attachment, error, what) -> None:
    """Raises `error` here and a pointer to it on every other rank when any rank has one."""
    import torch.distributed as dist
    if att.world_size > 1 and dist.is_available() and dist.is_initialized():
        group = _process_group(att)
        device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
        flag = torch.tensor([0 if error is None else 1 + dist.get_rank(group)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        failed = int(flag.item())
        if failed and error is None:
            raise ValueError(f"{what}: rank {failed - 1} could not prepare its live state (its "
                             "error says why); nothing was saved")
    if error is not None:
        raise error


def _has_per_rank(extra) -> bool:
    return any(isinstance(v, _state.PerRank) for v in (extra or {}).values())


def _process_group(att: _Attachment):
    import torch.distributed as dist
    if att.comm is not None and not isinstance(att.comm, str):
        return att.comm
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    raise ValueError("extra: per-rank state of several ranks needs torch.distributed "
                     "(the checkpointer's communicator is not a process group)")


def save_checkpoint(model: torch.nn.Module, optimizer, checkpoint_dir, *, extra=None,
                    overwrite=True, async_save=False, model_only=False, **runtime_options):
    """The seed's save_checkpoint: the model's main weights, the optimizer's state and its
    param groups as they are now, and `extra` ({name: Stateful or state dict}: LR scheduler,
    data loader, fm.torch.RNGState(), a train state), as a DCP checkpoint. A model that was
    never attached is described from its framework's attributes, compiled (cached) and
    attached first. Replaces an existing checkpoint atomically (overwrite=False refuses to).
    async_save=True returns the runtime's handle (wait() on it) once the buffers may change
    again. model_only=True saves the model's weights (and `extra`) alone: no optimizer state
    or param groups, about a third of the bytes with Adam (load it with
    exclude=["optimizer"]). runtime_options (threads, progress, buffered_io) go to
    Checkpointer.save."""
    att = _attachment_for(model, optimizer, "save_checkpoint")
    path = os.fspath(checkpoint_dir)
    step = (_optim.step_value(att.optimizer, att.trainable_params())
            if att.optimizer is not None else 0.0)
    try:
        items, error = _live_items(att, extra, with_optimizer=not model_only), None
    except Exception as e:  # raised below, after every rank knows (none may wait in the save)
        items, error = [], e
    _agree(att, error, "save_checkpoint")
    kwargs = dict(overwrite=overwrite, step=step, live_items=items, replace_planned_bytes=True,
                  model_only=model_only, **runtime_options)
    if async_save:
        return att.checkpointer.save_async(path, **kwargs)
    att.checkpointer.save(path, **kwargs)
    return None


def _refresh_compute_weights(att: _Attachment) -> None:
    """After a load: the compute weights the framework reads now hold main_weight cast to their
    dtype (the framework's own sync where it has one, else the runtime's cast), checked by
    reading them back."""
    adapter = att.adapter
    for g in att.groups:
        spec = g.roles.get("model_weight")
        if spec is None or spec.get("aliases") == "main_weight":
            continue
        params = [att.params[m.fqn] for m in g.members]
        synced = adapter.sync_model_weights(params) if params else False
        mw = att.buffers[(g.index, "model_weight")]
        main = att.buffers[(g.index, "main_weight")]
        if not synced:
            att.checkpointer.refresh_model_weights(g.index)
        fw = adapter.framework_buffers(params).get("model_weight") if params else None
        target = fw if fw is not None else mw
        want = main.to(target.dtype)
        ok = torch.isnan(want) | (target == want)
        if not bool(ok.all()):
            raise _fm().CheckpointError(
                f"load_checkpoint: the compute weights of {g.where()} do not hold the loaded "
                f"main weights after the refresh ({int((~ok).sum())} of {ok.numel()} elements "
                "differ)")


def _excluded(exclude, name) -> bool:
    """Whether the top-level state `name` ("optimizer", "lr_scheduler", ...) is excluded."""
    return any(e.rstrip(".") == name for e in exclude)


def load_checkpoint(model: torch.nn.Module, optimizer, checkpoint_dir, *,
                    sync_model_weights: bool = True, extra=None, strict: bool = True,
                    exclude=(), **runtime_options) -> Dict[str, List[str]]:
    """The seed's load_checkpoint: any DCP checkpoint of this model (saved on any world size:
    the runtime reshards) into the model's buffers in place, then the optimizer's step counts
    and param groups (every key, checked against the optimizer's groups), and `extra`'s state
    (each object's load_state_dict, or a dict updated in place). The compute weights the
    framework reads are refreshed from the main weights unless sync_model_weights=False.
    exclude=["optimizer", "lr_scheduler", ...] leaves those as they are (the weights of a
    model-only checkpoint into a fresh optimizer: exclude=["optimizer"]). Incompatible names
    what does not fit; strict=False loads what fits and returns what it left as
    {"left": [...]}."""
    att = _attachment_for(model, optimizer, "load_checkpoint")
    path = os.fspath(checkpoint_dir)
    exclude = [exclude] if isinstance(exclude, str) else list(exclude or ())
    if _excluded(exclude, "model"):
        raise ValueError("load_checkpoint: exclude=['model'] leaves nothing to load")
    result = att.checkpointer.load(path, sync_model_weights=False, exclude=exclude,
                                   **runtime_options)
    report: Dict[str, List[str]] = {}
    values: Dict[str, Any] = {}
    for key, data in (result.get("bytes_items") or {}).items():
        values[key] = data
    tensors = dict(result.get("tensor_items") or {})

    def value(key):
        if key in tensors:
            return tensors[key]
        return _state.read_bytes_item(key, values[key])

    if att.optimizer is not None and not _excluded(exclude, "optimizer"):
        give_loaded_state(att)
        if result.get("step") is not None:
            _optim.restore_steps(att.optimizer, att.params, float(result["step"]))
        elif strict and _optim.keeps_step(att.optimizer):
            raise _fm().Incompatible("load_checkpoint: the checkpoint holds no optimizer step "
                                     "(strict=False loads what fits)")
        saved = {k: value(k) for k in list(values) + list(tensors) if k.startswith(_PARAM_GROUPS)}
        _optim.restore_param_groups(att.optimizer, saved, att.fqn_of, strict, report,
                                    att.checkpoint_param_names)
    if sync_model_weights:
        _refresh_compute_weights(att)
    for name, obj in (extra or {}).items():
        if _excluded(exclude, name):
            continue
        per_rank = isinstance(obj, _state.PerRank)
        template = {str(att.rank): obj.state_dict()} if per_rank else _state.state_of(obj)
        prefix = f"{name}."
        found = {k: value(k) for k in list(values) + list(tensors) if k.startswith(prefix)}
        if per_rank:
            class _Into:  # unflatten gives {rank: state}; the object takes its own
                def load_state_dict(self, state, _obj=obj, _rank=str(att.rank)):
                    _obj.load_state_dict(state[_rank])
            _state.restore(name, _Into(), template, found, strict, report)
        else:
            _state.restore(name, obj, template, found, strict, report)
    return report


def load_pretrained(model: torch.nn.Module, pretrained_dir, optimizer=None, *, key_map=None,
                    sync_model_weights: bool = True, **runtime_options) -> Dict[str, Any]:
    """Starts fine-tuning from a Hugging Face model: `pretrained_dir` (model.safetensors, or
    the shards model.safetensors.index.json names, as save_pretrained writes them) into the
    model's packed buffers in place, each rank reading only the byte ranges of its own pieces,
    cast to the main-weight dtype. Tensor names are the model's FQNs; key_map renames them (a
    dict {name: fqn or None}, or a callable name -> fqn or None; None leaves a tensor out).
    Tied parameters are read once. The optimizer's state is zeroed with step 0 (what a fresh
    optimizer's first step sees) and the compute weights are refreshed. A tensor the model
    needs but the files lack, or one of another shape or a dtype that does not cast, raises
    Incompatible naming it. Returns the runtime's stats."""
    att = _attachment_for(model, optimizer, "load_pretrained")
    result = att.checkpointer.load(os.fspath(pretrained_dir), sync_model_weights=False,
                                   source="hf", key_map=key_map, **runtime_options)
    if att.optimizer is not None:
        _optim.reset_state(att.optimizer, att.params)
    if sync_model_weights:
        _refresh_compute_weights(att)
    return result
