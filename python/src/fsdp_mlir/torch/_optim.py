"""The optimizer's side of a checkpoint: its state tensors (created without a step), and its
param groups, which are live: saved as the optimizer holds them at each save, restored at load.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import torch

from ._layout import _local

#: The per-parameter state tensors of the optimizers a plan describes, by buffer role.
STATE_ROLES = ("exp_avg", "exp_avg_sq")


def supported(optimizer) -> None:
    """Refuses an optimizer whose state the plan cannot hold, naming what is missing."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise ValueError(f"optimizer {type(optimizer).__name__} is not supported yet: its state "
                         "is not exp_avg/exp_avg_sq (torch.optim.Adam or AdamW)")
    for i, group in enumerate(optimizer.param_groups):
        if group.get("amsgrad"):
            raise ValueError(f"optimizer param group {i} has amsgrad=True: max_exp_avg_sq is not "
                             "described by the plan yet")


def _scalar_dtype():
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def create_missing_state(optimizer, params: Sequence[Any], views) -> None:
    """Gives every parameter in `params` that the optimizer would step but has no state yet the
    state torch's Adam creates on its first step: step 0, zero moments. No step is taken and
    no value changes, so training afterwards is bit-identical to training without this. The
    moments are `views(param, role)` (views of packed buffers) where it gives one."""
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for p in params:
        group = groups.get(id(p))
        if group is None or not p.requires_grad:
            continue
        state = optimizer.state[p]
        if len(state) != 0:
            continue
        on_device = group.get("capturable") or group.get("fused")
        state["step"] = (torch.zeros((), dtype=_scalar_dtype(), device=_local(p).device)
                         if on_device else torch.tensor(0.0, dtype=_scalar_dtype()))
        for role in STATE_ROLES:
            view = views(p, role)
            state[role] = view if view is not None else torch.zeros_like(
                p, memory_format=torch.preserve_format)


def step_value(optimizer, params: Sequence[Any]) -> float:
    """The step count the checkpoint's `optimizer.state.<fqn>.step` items hold."""
    for p in params:
        st = optimizer.state.get(p)
        if st and "step" in st:
            s = st["step"]
            return float(s.item() if isinstance(s, torch.Tensor) else s)
    return 0.0


def restore_steps(optimizer, params_by_fqn: Mapping[str, Any], step: float) -> None:
    for p in params_by_fqn.values():
        st = optimizer.state.get(p)
        if not st or "step" not in st:
            continue
        old = st["step"]
        if isinstance(old, torch.Tensor):
            st["step"] = torch.full_like(old, step)
        else:
            st["step"] = step


def param_groups_state(optimizer, fqn_of) -> List[Dict[str, Any]]:
    """The optimizer's param groups as `optimizer.state_dict()` has them now, `params` as FQNs
    (what torch's get_optimizer_state_dict gives)."""
    ordered = [p for g in optimizer.param_groups for p in g["params"]]
    groups = optimizer.state_dict()["param_groups"]
    out = []
    for group in groups:
        entry = {}
        for key, value in group.items():
            if key == "params":
                value = [fqn_of(ordered[i]) for i in value]
            entry[key] = value
        out.append(entry)
    return out


def restore_param_groups(optimizer, saved: Mapping[str, Any], fqn_of, strict: bool,
                         report: Dict[str, List[str]]) -> None:
    """Puts the checkpoint's param groups (`saved`: flat key -> value, keys
    `optimizer.param_groups.<i>.<key>`) into the optimizer: every key of every group, checked
    to describe the same groups of the same parameters. Raises Incompatible naming the first
    difference unless strict=False (then what does not fit is left and listed in `report`)."""
    from ._layout import _fm
    by_group: Dict[int, Dict[str, Any]] = {}
    prefix = "optimizer.param_groups."
    for key, value in saved.items():
        rest = key[len(prefix):]
        index, _, name = rest.partition(".")
        if not index.isdigit() or not name:
            continue
        by_group.setdefault(int(index), {})[name] = value
    live = optimizer.param_groups

    def problem(text):
        if strict:
            raise _fm().Incompatible(f"load_checkpoint: {text} (strict=False loads what fits)")
        report.setdefault("left", []).append(text)

    if not by_group:
        problem("the checkpoint holds no optimizer param groups")
        return
    if sorted(by_group) != list(range(len(by_group))) or len(by_group) != len(live):
        problem(f"the checkpoint has {len(by_group)} optimizer param groups, the optimizer "
                f"{len(live)}")
        if len(by_group) != len(live):
            return
    for i, group in enumerate(live):
        stored = by_group.get(i, {})
        fqns = [fqn_of(p) for p in group["params"]]
        if "params" in stored and list(stored["params"]) != fqns:
            theirs = list(stored["params"])
            only_ours = [f for f in fqns if f not in theirs]
            only_theirs = [f for f in theirs if f not in fqns]
            problem(f"param group {i} holds other parameters in the checkpoint "
                    f"(only in the optimizer: {only_ours[:3]}, only in the checkpoint: "
                    f"{only_theirs[:3]})")
            continue
        for name in group:
            if name != "params" and name not in stored:
                problem(f"param group {i} key {name!r} is missing in the checkpoint")
        for name, value in stored.items():
            if name == "params":
                continue
            current = group.get(name)
            if isinstance(current, torch.Tensor) and not isinstance(value, torch.Tensor):
                current.fill_(value)
            elif isinstance(current, torch.Tensor):
                current.copy_(value)
            else:
                group[name] = value

