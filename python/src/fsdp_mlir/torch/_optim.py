"""The optimizer's side of a checkpoint: its state tensors (created without a step), and its
param groups, which are live: saved as the optimizer holds them at each save, restored at load.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import torch

from ._layout import _local

_SUPPORTED = "torch.optim.Adam, torch.optim.AdamW (amsgrad too) and torch.optim.SGD"


def _number(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def _kind(optimizer) -> str:
    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adamw" if optimizer.defaults.get("decoupled_weight_decay") else "adam"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    raise ValueError(f"optimizer {type(optimizer).__name__} is not supported: the plan describes "
                     f"the state of {_SUPPORTED}")


def _same_in_every_group(optimizer, key: str, test) -> bool:
    """What `test` says of every param group's `key`, refusing groups that disagree: the plan
    gives every parameter the same state tensors."""
    seen = {bool(test(g.get(key))) for g in optimizer.param_groups}
    if len(seen) > 1:
        values = [g.get(key) for g in optimizer.param_groups]
        raise ValueError(f"optimizer param groups differ in {key} ({values}): they would keep "
                         "different state tensors, and a plan gives every parameter the same "
                         "ones")
    return seen.pop() if seen else False


def state_roles(optimizer) -> Tuple[str, ...]:
    """The per-parameter state tensors the optimizer keeps, in torch's names and order (the
    plan's buffer roles: OptimizerOp::getStateTensors decides the same from a description)."""
    kind = _kind(optimizer)
    if kind == "sgd":
        momentum = _same_in_every_group(optimizer, "momentum", lambda m: _number(m or 0) != 0)
        return ("momentum_buffer",) if momentum else ()
    amsgrad = _same_in_every_group(optimizer, "amsgrad", bool)
    return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if amsgrad else ())


def keeps_step(optimizer) -> bool:
    """Whether the optimizer keeps a `step` per parameter (Adam, AdamW; not SGD)."""
    return _kind(optimizer) != "sgd"


def supported(optimizer) -> None:
    """Refuses an optimizer whose state the plan cannot hold, naming why."""
    state_roles(optimizer)


def description(optimizer, state_dtype) -> Dict[str, Any]:
    """The description's optimizer (docs/ModelDescription.md): group 0's hyper-parameters (what
    fsdp-ckpt writes; a save through fsdp_mlir.torch writes every group's live values) and the
    state tensors the optimizer keeps."""
    kind, roles = _kind(optimizer), state_roles(optimizer)
    first = optimizer.param_groups[0]
    out: Dict[str, Any] = {"kind": kind, "lr": _number(first["lr"]),
                           "weight_decay": _number(first["weight_decay"])}
    if kind == "sgd":
        out.update(momentum=_number(first["momentum"]), dampening=_number(first["dampening"]),
                   nesterov=bool(first["nesterov"]))
    else:
        out.update(betas=[_number(b) for b in first["betas"]], eps=_number(first["eps"]),
                   amsgrad="max_exp_avg_sq" in roles)
    if state_dtype is None and roles:
        for st in optimizer.state.values():
            t = st.get(roles[0]) if isinstance(st, Mapping) else None
            if isinstance(t, torch.Tensor):
                state_dtype = t.dtype
                break
    out["state_dtype"] = state_dtype if state_dtype is not None else "f32"
    out["state"] = list(roles)
    return out


def _scalar_dtype():
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


#: State torch creates as zeros on a parameter's first step, before using it: creating it
#: earlier changes nothing. SGD's momentum_buffer is a copy of the first gradient instead, so
#: it is left for torch to create.
CREATED_AS_ZEROS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


def create_missing_state(optimizer, params: Sequence[Any], views) -> None:
    """Gives every parameter in `params` that the optimizer would step but has no state yet the
    state torch's Adam creates on its first step: step 0, zero moments (and maximum, with
    amsgrad). No step is taken and no value changes, so training afterwards is bit-identical
    to training without this. The tensors are `views(param, role)` (views of packed buffers)
    where it gives one. SGD's state is left to torch (see CREATED_AS_ZEROS)."""
    roles = [r for r in state_roles(optimizer) if r in CREATED_AS_ZEROS]
    if not roles:
        return
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
        for role in roles:
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


def reset_state(optimizer, params_by_fqn: Mapping[str, Any]) -> None:
    """After a load of weights alone (the runtime zeroed the state buffers): the state a fresh
    optimizer's first step sees. Steps go to 0; state torch creates from the first gradient
    (SGD's momentum_buffer, not zeros) is dropped, for torch to create again."""
    restore_steps(optimizer, params_by_fqn, 0.0)
    for p in params_by_fqn.values():
        st = optimizer.state.get(p)
        if st:
            for role in [r for r in st if r not in CREATED_AS_ZEROS and r != "step"]:
                del st[role]


def param_groups_state(optimizer, fqn_of, names=lambda fqns: fqns) -> List[Dict[str, Any]]:
    """The optimizer's param groups as `optimizer.state_dict()` has them now, `params` as FQNs
    (what torch's get_optimizer_state_dict gives), through `names` (experts: their global
    names)."""
    ordered = [p for g in optimizer.param_groups for p in g["params"]]
    groups = optimizer.state_dict()["param_groups"]
    out = []
    for group in groups:
        entry = {}
        for key, value in group.items():
            if key == "params":
                value = names([fqn_of(ordered[i]) for i in value])
            entry[key] = value
        out.append(entry)
    return out


def _is_number(x) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) or (
        isinstance(x, torch.Tensor) and x.numel() == 1 and not x.dtype == torch.bool)


def _same_kind(current, value) -> bool:
    """Whether a checkpoint's param-group value may replace the optimizer's `current`: a
    number for a number or a one-element tensor, a bool for a bool, a str for a str, a
    sequence of as many such for a sequence (betas). None on either side (foreach, fused,
    differentiable may be None or a bool) and kinds torch does not use are let through."""
    if current is None or value is None:
        return True
    if isinstance(current, bool):
        return isinstance(value, bool)
    if _is_number(current):
        return _is_number(value)
    if isinstance(current, str):
        return isinstance(value, str)
    if isinstance(current, (list, tuple)):
        return (isinstance(value, (list, tuple)) and len(value) == len(current)
                and all(_same_kind(c, v) for c, v in zip(current, value)))
    return True


def _shown(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def restore_param_groups(optimizer, saved: Mapping[str, Any], fqn_of, strict: bool,
                         report: Dict[str, List[str]], names=lambda fqns: fqns) -> None:
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
        fqns = names([fqn_of(p) for p in group["params"]])
        if "params" in stored and (not isinstance(stored["params"], (list, tuple)) or
                                   not all(isinstance(f, str) for f in stored["params"])):
            problem(f"param group {i} key 'params' holds {_shown(stored['params'])} in the "
                    "checkpoint, not a list of parameter names")
            continue
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
            if name in group and not _same_kind(current, value):
                problem(f"param group {i} key {name!r} holds {_shown(value)} in the checkpoint, "
                        f"the optimizer's is {_shown(current)}")
                continue
            if isinstance(value, list) and isinstance(current, tuple):
                value = tuple(value)  # betas: the optimizer's own kind of sequence
            if isinstance(current, torch.Tensor) and not isinstance(value, torch.Tensor):
                current.fill_(value)
            elif isinstance(current, torch.Tensor):
                current.copy_(value)
            else:
                group[name] = value

