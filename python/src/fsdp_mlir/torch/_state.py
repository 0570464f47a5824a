"""Live state as checkpoint items: nested state dicts flattened as torch.distributed.checkpoint
flattens them (so `dcp.load` reads them too), each leaf a tensor item or a bytes item (the
`torch.save` bytes DCP writes for a non-tensor), read back with weights-only semantics (no code
runs: never `pickle.loads`).

The job's other state (`extra=`) is a {name: Stateful or state dict}; per-rank state (RNGState,
or any PerRank) is kept for every rank under `<name>.<rank>`, gathered to the committing rank.
"""

from __future__ import annotations

import io
import random
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from ._describe import _is_dtensor

#: (key, value, path): value a CPU tensor (a tensor item) or bytes (a bytes item).
Item = Tuple[str, Any, Tuple[Any, ...]]


def _flatten(state: Mapping[str, Any]):
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    return flatten_state_dict(dict(state))


def to_items(state: Mapping[str, Any]) -> List[Item]:
    """The items of a nested state dict, keys and paths as DCP's flatten_state_dict makes them."""
    flat, paths = _flatten(state)
    items = []
    for key, value in flat.items():
        if _is_dtensor(value):
            raise ValueError(f"{key}: a DTensor in live state: only parameters and their "
                             "optimizer state may be sharded")
        if isinstance(value, torch.Tensor):
            items.append((key, value.detach().cpu().contiguous(), tuple(paths[key])))
        else:
            buf = io.BytesIO()
            torch.save(value, buf)
            items.append((key, buf.getvalue(), tuple(paths[key])))
    return items


def read_bytes_item(key: str, data: bytes):
    """A bytes item's value, loaded weights-only (a file that needs code to load is refused)."""
    from .._errors import Corrupt
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # torch's unpickler names what it refused
        raise Corrupt(f"{key}: the item does not load with weights_only=True: "
                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def state_of(obj) -> Any:
    """What a Stateful (state_dict()) or a plain state dict holds now."""
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        return obj.state_dict()
    if isinstance(obj, Mapping):
        return obj
    raise TypeError(f"extra state must be Stateful (state_dict/load_state_dict) or a dict, "
                    f"got {type(obj).__name__}")


def restore(name: str, obj, template_state, found: Mapping[str, Any], strict: bool,
            report: Dict[str, List[str]]) -> None:
    """Loads `found` (flat key -> value) into obj as DCP's load would: the keys of obj's
    current state dict, unflattened into that shape, then load_state_dict (or, for a plain
    dict, an in-place update)."""
    from torch.distributed.checkpoint._nested_dict import unflatten_state_dict
    from .._errors import Incompatible
    flat, paths = _flatten({name: template_state})
    missing = [k for k in flat if k not in found]
    if missing:
        if strict:
            raise Incompatible(f"load_checkpoint: {missing[0]!r} is missing in the checkpoint "
                               f"({len(missing)} keys of extra state {name!r}; strict=False "
                               "loads what fits)")
        report.setdefault("left", []).extend(missing)
    values = {}
    for k in flat:
        if k in found:
            v = found[k]
            old = flat[k]
            if isinstance(old, torch.Tensor):
                try:
                    v = _fitted(k, v, old)
                except Incompatible:
                    if strict:
                        raise
                    report.setdefault("left", []).append(k)
                    v = old  # strict=False: what does not fit stays as it is
            values[k] = v
        else:
            values[k] = flat[k]
    state = unflatten_state_dict(values, paths)[name]
    if hasattr(obj, "load_state_dict") and callable(obj.load_state_dict):
        obj.load_state_dict(state)
    else:
        obj.clear()
        obj.update(state)


def _fitted(key: str, value, old: torch.Tensor) -> torch.Tensor:
    """The checkpoint's tensor `value` for the live tensor `old` (its dtype and device, as
    DCP's load copies it), or Incompatible naming the key when it does not fit: another
    shape (a reshape would fail or scramble the values), or no tensor at all."""
    from .._errors import Incompatible
    if not isinstance(value, torch.Tensor):
        raise Incompatible(f"load_checkpoint: {key!r} holds a {type(value).__name__} in the "
                           f"checkpoint, a tensor {list(old.shape)} {old.dtype} here "
                           "(strict=False loads what fits)")
    if tuple(value.shape) != tuple(old.shape):
        dtypes = (f" ({value.dtype} in the checkpoint, {old.dtype} here)"
                  if value.dtype != old.dtype else "")
        raise Incompatible(f"load_checkpoint: {key!r} has shape {list(value.shape)} in the "
                           f"checkpoint and {list(old.shape)} here{dtypes} (strict=False "
                           "loads what fits)")
    return value.to(dtype=old.dtype, device=old.device)


class PerRank:
    """Marks extra state that differs between ranks: saved for every rank under
    `<name>.<rank>`, and each rank loads its own."""

    def __init__(self, obj):
        self.obj = obj

    def state_dict(self):
        return state_of(self.obj)

    def load_state_dict(self, state):
        if hasattr(self.obj, "load_state_dict"):
            self.obj.load_state_dict(state)
        else:
            self.obj.clear()
            self.obj.update(state)


class RNGState(PerRank):
    """This rank's random number generators: torch's CPU generator, every CUDA device's (when
    CUDA is initialised), Python's `random` and NumPy's global state. Per rank:
    `extra={"rng": fm.torch.RNGState()}` saves every rank's and restores each rank's own."""

    def __init__(self):
        super().__init__(None)

    def state_dict(self):
        state: Dict[str, Any] = {"torch_cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["torch_cuda"] = {str(i): s for i, s in enumerate(torch.cuda.get_rng_state_all())}
        version, internal, gauss = random.getstate()
        state["python"] = {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                           "gauss": gauss}
        try:
            import numpy as np
        except ImportError:
            np = None
        if np is not None:
            kind, keys, pos, has_gauss, cached = np.random.get_state()
            state["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(keys.astype("int64")),
                              "pos": int(pos), "has_gauss": int(has_gauss),
                              "cached_gaussian": float(cached)}
        return state

    def load_state_dict(self, state):
        torch.set_rng_state(state["torch_cpu"].to(torch.uint8))
        cuda = state.get("torch_cuda")
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([cuda[str(i)].to(torch.uint8) for i in range(len(cuda))])
        py = state.get("python")
        if py is not None:
            random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()),
                             py["gauss"]))
        npst = state.get("numpy")
        if npst is not None:
            import numpy as np
            np.random.set_state((npst["kind"], npst["keys"].numpy().astype("uint32"),
                                 npst["pos"], npst["has_gauss"], npst["cached_gaussian"]))


def extra_items(extra: Optional[Mapping[str, Any]], rank: int) -> Tuple[List[Item], List[Item]]:
    """(shared items, this rank's per-rank items) of `extra`."""
    shared, mine = [], []
    for name, obj in (extra or {}).items():
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"extra: names are non-empty strings without '.', got {name!r}")
        if name in ("model", "optimizer"):
            raise ValueError(f"extra: {name!r} is the checkpoint's own")
        if isinstance(obj, PerRank):
            mine += to_items({name: {str(rank): obj.state_dict()}})
        else:
            shared += to_items({name: state_of(obj)})
    return shared, mine


def gather_to(root: int, items: List[Item], group) -> List[Item]:
    """Every rank's `items` on `root` (others get []), over a torch.distributed group: each
    rank's items travel as one torch.save blob, loaded weights-only."""
    import torch.distributed as dist
    if group is None or not dist.is_available() or not dist.is_initialized():
        return list(items)
    world = dist.get_world_size(group)
    if world == 1:
        return list(items)
    buf = io.BytesIO()
    torch.save([(k, v, list(p)) for k, v, p in items], buf)
    blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    backend_device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    size = torch.tensor([blob.numel()], dtype=torch.int64, device=backend_device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=backend_device)
    padded[: blob.numel()] = blob.to(backend_device)
    parts = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    me = dist.get_rank(group)
    if me != root:
        return []
    out: List[Item] = []
    for r, (part, n) in enumerate(zip(parts, sizes)):
        data = part[: int(n.item())].cpu().numpy().tobytes()
        try:
            got = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as e:
            raise ValueError(f"extra: rank {r}'s per-rank state is not weights-only loadable: "
                             f"{str(e).splitlines()[0]}") from None
        out += [(k, v, tuple(p)) for k, v, p in got]
    return out
