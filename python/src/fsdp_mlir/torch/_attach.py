"""attach: the model's packed buffers bound to a Checkpointer over a compiled plan.

What attach records is the plan and what is ours (buffers we allocated: optimizer state moved
into the plan's layout, a model_weight or main_grad the model has none of). Memory the
training framework owns is never kept from one call to the next: every save and load looks the
parameters and the framework's buffers up again (`resolve`), checks each against the plan
(offset, size, dtype, device) and binds what it found. Creating missing optimizer state takes
no optimizer step and changes no value.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from . import _optim
from ._describe import _storage_key
from ._layout import (LayoutMismatch, _find_packed, _fm, _Group, _load_layout, _local,
                      _rewrap)
from .adapters import find as find_adapter

_ATTR = "_fsdp_mlir_attachment"


class _Attachment:
    def __init__(self):
        self.checkpointer = None
        self.optimizer = None
        self.groups: List[_Group] = []
        self.params: Dict[str, Any] = {}      # as resolved by the last call (set_params)
        self._members: Dict[int, Tuple[_Group, Any]] = {}
        self.buffers: Dict[Tuple[int, str], torch.Tensor] = {}  # bound by the last call
        self.given: Dict[Tuple[int, str], torch.Tensor] = {}    # attach's buffers=
        self.own: Dict[Tuple[int, str], torch.Tensor] = {}      # allocated here
        self.rank = 0
        self.world_size = 1
        self.comm = None
        self.plan = None
        self.layout = None
        self.adapter = None

    def member_of(self, p):
        """(group, member) of a parameter as resolved by the last call, or (None, None)."""
        return self._members.get(id(p), (None, None))

    def set_params(self, params: Dict[str, Any]) -> None:
        self.params = params
        self._members = {id(params[m.fqn]): (g, m) for g in self.groups for m in g.members}

    def fqn_of(self, p) -> str:
        g, m = self.member_of(p)
        if m is None:
            raise ValueError("the optimizer steps a parameter that is not in the plan "
                             f"(shape {tuple(p.shape)})")
        return m.fqn

    def checkpoint_param_names(self, fqns: List[str]) -> List[str]:
        """An optimizer param group's FQNs as a checkpoint lists them: an experts unit's
        parameters under their global names, where its first one stands, in the order a
        model holding every expert lists them (the plan's `params`, docs/Experts.md)."""
        member_of = {m.fqn: (g, m) for g in self.groups for m in g.members}
        out: List[str] = []
        listed = set()
        for fqn in fqns:
            g, m = member_of.get(fqn, (None, None))
            if m is None or m.expert is None:
                out.append(fqn)
                continue
            if g.index in listed:
                continue
            listed.add(g.index)
            slots = []
            for f in fqns:
                other = member_of.get(f, (None, None))
                if other[0] is g:
                    slot = (other[1].expert["head"], other[1].expert["tail"])
                    if slot not in slots:
                        slots.append(slot)
            count = int(g.experts["count"])
            if g.experts["naming"] == "grouped":
                out += [f"{h}{n}{t}" for h, t in slots for n in range(count)]
            else:
                out += [f"{h}{n}{t}" for n in range(count) for h, t in slots]
        return out

    def trainable_params(self) -> List[Any]:
        return [self.params[m.fqn] for g in self.groups if g.requires_grad for m in g.members]

def attached(model) -> Optional[_Attachment]:
    """What attach recorded on the model (None if it was never attached)."""
    return model.__dict__.get(_ATTR)


def _resolve_comm(comm, rank, world_size, layout_world):
    import torch.distributed as dist
    if comm is None and layout_world > 1 and dist.is_available() and dist.is_initialized():
        comm = dist.group.WORLD
    if comm is None:
        return None, (0 if rank is None else rank), (1 if world_size is None else world_size)
    if isinstance(comm, str):
        if rank is None:
            for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK"):
                if var in os.environ:
                    rank = int(os.environ[var])
                    break
        if world_size is None:
            for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"):
                if var in os.environ:
                    world_size = int(os.environ[var])
                    break
        return comm, (0 if rank is None else rank), (layout_world if world_size is None
                                                     else world_size)
    return comm, dist.get_rank(comm), dist.get_world_size(comm)




def attach(model: torch.nn.Module, optimizer, plan, comm=None, *, layout=None,
           buffers: Optional[Mapping[Tuple[int, str], torch.Tensor]] = None,
           rank: Optional[int] = None, world_size: Optional[int] = None):
    """Bind the model's packed buffers to a Checkpointer over `plan` and record it on the model.

    plan: the model.fsdpplan fm.compile returned (its layout is read from layout.json or
    lowered.mlir beside it, or given as layout=). comm: None (a world of one, or the default
    process group when torch.distributed is initialised), "mpi", or a ProcessGroup. Raises
    LayoutMismatch (a ValueError and an fm.Incompatible) naming the first parameter that is not
    where the plan puts it. Optimizer state that is missing is created as torch's Adam creates
    it on its first step (step 0, zero moments), without a step. Returns the Checkpointer."""
    fm = _fm()
    adapter = find_adapter(model)
    why = adapter.refuse(model)
    if why:
        raise ValueError(f"attach: {why}")
    if optimizer is not None:
        _optim.supported(optimizer)
    layout = _load_layout(plan, layout)
    if layout.get("format") != "fsdp-layout-v1":
        raise ValueError("attach: the layout is not an fsdp-layout-v1 document")
    layout_world = math.prod(a["size"] for a in layout["mesh"])
    comm, rank, world_size = _resolve_comm(comm, rank, world_size, layout_world)
    if world_size != layout_world:
        raise ValueError(f"attach: the plan is for {layout_world} ranks, this job has "
                         f"{world_size}")

    att = _Attachment()
    att.rank, att.world_size, att.plan, att.layout = rank, world_size, os.fspath(plan), layout
    att.optimizer, att.comm, att.adapter = optimizer, comm, adapter
    att.groups = [_Group(i, g, rank) for i, g in enumerate(layout["groups"])]
    att.given = dict(buffers or {})
    att.checkpointer = fm.Checkpointer(att.plan, rank=rank, world_size=world_size, comm=comm)
    _check_plan_buffers(att)
    resolve(model, att, "attach")
    model.__dict__[_ATTR] = att
    return att.checkpointer


def detach(model) -> None:
    """Forget what attach recorded (the model and optimizer keep their buffers)."""
    model.__dict__.pop(_ATTR, None)


def _check_plan_buffers(att: _Attachment) -> None:
    by_group: Dict[int, Dict[str, Any]] = {}
    for b in att.checkpointer.buffers:
        by_group.setdefault(b["group"], {})[b["role"]] = b
    if sorted(by_group) != list(range(len(att.groups))):
        raise ValueError(f"attach: the plan has {len(by_group)} groups, its layout "
                         f"{len(att.groups)}: the layout is not this plan's")
    for g in att.groups:
        roles = by_group[g.index]
        if set(roles) != set(g.roles):
            raise ValueError(f"attach: {g.where()} has buffers {sorted(roles)} in the plan and "
                             f"{sorted(g.roles)} in the layout: the layout is not this plan's")
        for role, b in roles.items():
            if b["elements"] != g.shard_size:
                raise ValueError(f"attach: {g.where()} {role}: the plan says {b['elements']} "
                                 f"elements, the layout {g.shard_size}")


def _resolve_params(model, att: _Attachment) -> Dict[str, Any]:
    named = dict(model.named_parameters(remove_duplicate=False))
    params, planned = {}, set()
    for g in att.groups:
        for m in g.members:
            first = None
            for f in m.fqns:
                planned.add(f)
                if f not in named:
                    raise LayoutMismatch(f"the plan's parameter {f!r} is not a parameter of the "
                                         "model")
                if first is None:
                    first = named[f]
                elif named[f] is not first and _storage_key(named[f]) != _storage_key(first):
                    raise LayoutMismatch(f"{f!r} is tied to {m.fqn!r} in the plan but is a "
                                         "separate tensor in the model")
            params[m.fqn] = first
    extra = [f for f in named if f not in planned]
    if extra:
        raise LayoutMismatch(f"model parameter {extra[0]!r} is not in the plan ({len(extra)} "
                             "such)")
    return params


def _own(att: _Attachment, g: _Group, role: str, device) -> torch.Tensor:
    """A buffer of ours for (group, role), zeroed when first made."""
    key = (g.index, role)
    t = att.own.get(key)
    if t is None or t.device != torch.device(device):
        t = torch.zeros(g.shard_size, dtype=g.dtype(role), device=device)
        att.own[key] = t
    return t


def _check_framework_buffer(g: _Group, role: str, t, device) -> torch.Tensor:
    if (t.numel() != g.shard_size or t.dtype != g.dtype(role) or not t.is_contiguous()
            or t.device != device):
        raise LayoutMismatch(
            f"the framework's {role} buffer of {g.where()} is {t.numel()} elements of {t.dtype} "
            f"on {t.device}{'' if t.is_contiguous() else ' (not contiguous)'}; the plan needs "
            f"{g.shard_size} contiguous elements of {g.dtype(role)} on {device}")
    return t


def resolve(model, att: _Attachment, what: str) -> None:
    """Looks every buffer up as the model and framework hold it now, checks it against the plan,
    creates missing optimizer state (no step), and binds all of it."""
    try:
        att.set_params(_resolve_params(model, att))
    except LayoutMismatch as e:
        raise LayoutMismatch(f"{what}: {e}") from None
    adapter = find_adapter(model)
    why = adapter.refuse(model)
    if why:
        raise ValueError(f"{what}: {why}")
    found: Dict[Tuple[int, str], torch.Tensor] = {}
    for g in att.groups:
        members = [(m, att.params[m.fqn]) for m in g.members]
        main, how = _find_packed(g, "main_weight", members, "parameter", allow_adopt=False)
        framework = adapter.framework_buffers([p for _, p in members]) if members else {}
        if main is None:
            main = att.given.get((g.index, "main_weight"))
            if main is None:
                device = _local(members[0][1]).device if members else torch.device("cpu")
                main = _own(att, g, "main_weight", device)
        fw_main = framework.get("main_weight")
        if fw_main is not None and fw_main.data_ptr() != main.data_ptr():
            framework = {}  # the framework's group is not this plan group's buffer
        found[(g.index, "main_weight")] = main
        for role in ("model_weight", "main_grad"):
            spec = g.roles.get(role)
            if spec is None or spec.get("aliases") == "main_weight":
                continue
            t = framework.get(role)
            if t is not None:
                t = _check_framework_buffer(g, role, t, main.device)
            if t is None:
                t = att.given.get((g.index, role))
            if t is None and role == "main_grad":
                grads = [(m, p.grad) for m, p in members]
                if grads and all(gr is not None for _, gr in grads):
                    packed, how = _find_packed(g, role, grads, "gradient of", allow_adopt=True)
                    t = packed if how == "packed" else None
            if t is None:
                fresh = (g.index, role) not in att.own
                t = _own(att, g, role, main.device)
                if role == "model_weight" and fresh:
                    t.copy_(main.to(t.dtype))  # as the runtime's cast: round to nearest even
            found[(g.index, role)] = t
    if att.optimizer is not None:
        _optimizer_state(att, found)
    att.buffers = found
    ck = att.checkpointer
    for b in ck.buffers:
        if b.get("aliases"):
            continue
        t = found.get((b["group"], b["role"]))
        if t is None:
            raise ValueError(f"{what}: no buffer for group {b['group']} {b['role']}")
        ck.bind(b["group"], b["role"], t)


def _member_view(buf: torch.Tensor, m) -> torch.Tensor:
    """A member's rows in this rank's shard of a packed buffer, in its local shape."""
    return buf[m.local_offset: m.local_offset + m.rows * m.row_size].view(m.local_shape)


def _optimizer_state(att: _Attachment, found) -> None:
    """The optimizer's state tensors as views of packed buffers of the plan's layout: where they
    already are (the framework's or ours), else moved into buffers of ours; missing Adam state
    is created there (step 0, zeros: what torch's first step would create). State torch has
    not created yet and creates otherwise (SGD's momentum_buffer, a copy of the first
    gradient) is left missing; its part of the buffer is zero, as a checkpoint holds it."""
    opt = att.optimizer
    roles = _optim.state_roles(opt)
    roles_of = {g.index: [r for r in roles if r in g.roles] for g in att.groups}

    def views(p, role):
        g, m = att.member_of(p)
        if g is None or role not in roles_of[g.index]:
            return None
        return _rewrap(p, _member_view(_own(att, g, role, found[(g.index, "main_weight")].device),
                                       m))

    _optim.create_missing_state(opt, att.trainable_params(), views)
    for g in att.groups:
        for role in roles_of[g.index]:
            held, missing = [], []
            for m in g.members:
                st = opt.state.get(att.params[m.fqn])
                if st and role in st and st[role] is not None:
                    held.append((m, st[role]))
                elif role in _optim.CREATED_AS_ZEROS:
                    raise ValueError(f"the optimizer has no {role} for parameter {m.fqn!r} (is "
                                     "it one of the optimizer's parameters?)")
                else:
                    missing.append(m)
            buf, how = (_find_packed(g, role, held, f"optimizer state {role} of",
                                     allow_adopt=True) if held else (None, "none"))
            if how != "packed" or missing:
                main = found[(g.index, "main_weight")]
                buf = att.given.get((g.index, role))
                if buf is None:
                    buf = _own(att, g, role, main.device)
                for m, old in held:
                    view = _rewrap(old, _member_view(buf, m))
                    if m.rows > 0 and _local(old).data_ptr() != _local(view).data_ptr():
                        _local(view).copy_(_local(old).reshape(m.local_shape))
                    opt.state[att.params[m.fqn]][role] = view
                for m in missing:
                    if m.rows > 0:
                        _member_view(buf, m).zero_()
            found[(g.index, role)] = buf


def give_loaded_state(att: _Attachment) -> None:
    """After a load: every trainable parameter holds each state tensor, as views of the buffers
    the load filled (state torch creates lazily, such as SGD's momentum_buffer, included)."""
    opt = att.optimizer
    stepped = {id(p) for group in opt.param_groups for p in group["params"]}
    for g in att.groups:
        for role in _optim.state_roles(opt):
            buf = att.buffers.get((g.index, role))
            if buf is None or not g.requires_grad:
                continue
            for m in g.members:
                p = att.params[m.fqn]
                if id(p) not in stepped:
                    continue
                st = opt.state[p]
                if st.get(role) is None:
                    st[role] = _rewrap(p, _member_view(buf, m))
