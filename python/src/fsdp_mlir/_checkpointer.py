"""fsdp_mlir.Checkpointer: one rank's checkpoint runtime over a plan.

The buffers are the runtime's (allocate) or the caller's (bind: a torch
tensor or any DLPack object, no copy); `tensor` views one as a torch tensor
(DLPack, no copy). save, save_async, load, fill and check run in the C++
runtime with the GIL released.
"""

import atexit
import operator
import os
import weakref

from . import _core

__all__ = ["Checkpointer", "SaveHandle"]

_live = weakref.WeakSet()
_handles = weakref.WeakSet()  # SaveHandles alive


@atexit.register
def _wait_for_saves():
    # A save still running at exit finishes before the interpreter goes.
    for checkpointer in list(_live):
        try:
            if checkpointer._core is not None:
                checkpointer._core.wait_for_pending_save()
        except Exception:
            pass
    # Then the runtime's objects are freed, while the interpreter and the extension are
    # whole. A checkpointer still reachable at exit (the drop-in path records it on the model,
    # and a model a framework keeps in a cycle, a hook or a global outlives the program's
    # references to it) would be freed after the extension's teardown, or never: nanobind
    # reports each such instance as leaked. Nothing runs after atexit that could use them.
    for handle in list(_handles):
        handle._handle = None
    for checkpointer in list(_live):
        checkpointer._release()


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        return None
    return torch


class _Progress:
    """progress=: None, a callable(done_bytes, total_bytes), or True (a tqdm
    bar when tqdm is installed)."""

    def __init__(self, progress, what):
        self.bar = None
        self.callback = None
        if progress is None or progress is False:
            return
        if progress is True:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                return
            self._tqdm = tqdm
            self._what = what
            self.callback = self._update
        elif callable(progress):
            self.callback = progress
        else:
            raise TypeError("progress must be None, True or a callable(done_bytes, total_bytes)")

    def _update(self, done, total):
        if self.bar is None:
            self.bar = self._tqdm(total=total, unit="B", unit_scale=True, desc=self._what)
        self.bar.update(done - self.bar.n)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class SaveHandle:
    """A save running in the background (Checkpointer.save_async)."""

    def __init__(self, handle, progress, checkpointer):
        self._handle = handle
        _handles.add(self)
        self._progress = progress
        self._checkpointer = checkpointer  # outlives the save
        self._result = None

    def wait(self):
        """Waits for the writes and the commit; returns this rank's stats
        (a dict) or raises the save's error (every rank gets the same)."""
        try:
            if self._result is None:
                self._result = self._handle.wait()
            return dict(self._result)
        finally:
            self._progress.close()

    def done(self):
        """True once wait() will not block."""
        return self._handle.done()

    @property
    def stall_seconds(self):
        """How long save_async held the caller (the copy into host memory)."""
        return self._handle.stall_seconds


def _is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"


class Checkpointer:
    """One rank's checkpoint runtime over a compiled plan.

    comm: None (a world of one; with world_size > 1, a rank without a
    communicator: its buffers, tensor views and fill work, collectives do
    not), "mpi" (MPI_COMM_WORLD), or a torch.distributed ProcessGroup (or
    torch.distributed.group.WORLD): the checkpointer then makes a gloo group
    of its own over the group's ranks, so the constructor is collective over
    that group. rank and world_size, when given, must match the
    communicator's. device: where allocate() puts the buffers ("cpu",
    "cuda", "cuda:N"); by default the first bind decides (the host for
    allocate).
    """

    def __init__(self, plan, rank=None, world_size=None, comm=None, *, device=None):
        plan = os.fspath(plan)
        self._bound = {}
        self._records = {}  # (group, role) -> _Bound of a torch tensor
        self._detached = False
        self._comm = None
        if rank is not None and (not isinstance(rank, int) or rank < 0):
            raise ValueError(f"rank must be a non-negative integer, not {rank!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
            raise ValueError(f"world_size must be a positive integer, not {world_size!r}")
        core_comm = comm
        if comm is None:
            self._detached = (world_size or 1) > 1
        elif isinstance(comm, str):
            if comm not in ("mpi", "default"):
                raise ValueError(f"unknown communicator {comm!r} (None, \"mpi\" or a "
                                 "torch.distributed process group)")
            if comm == "mpi":
                _make_mpi_global()
        else:
            torch = _torch()
            if torch is None or not _is_process_group(comm):
                raise TypeError("comm must be None, \"mpi\" or a torch.distributed "
                                f"ProcessGroup, not {type(comm).__name__}")
            from ._comm import TorchCommunicator

            self._comm = TorchCommunicator.over(comm)
            core_comm = self._comm
        self._core = _core.Checkpointer(
            plan, core_comm, -1 if rank is None else rank, -1 if world_size is None else world_size)
        if device is not None:
            self._core.set_device(_device_name(device))
        _live.add(self)

    def _release(self):
        """Frees the runtime's checkpointer, then what it used (at exit: _wait_for_saves)."""
        self._core = None
        self._records = {}
        self._bound = {}
        self._comm = None

    # -- what the plan says ---------------------------------------------------
    @property
    def rank(self):
        return self._core.rank

    @property
    def world_size(self):
        return self._core.world_size

    @property
    def commit_rank(self):
        """The plan's committing rank: the one whose live_items a save writes."""
        return self._core.root

    @property
    def plan(self):
        return self._core.plan

    @property
    def device(self):
        """"cpu", "cuda:N", or None before the first allocate or bind."""
        return self._core.device

    @property
    def buffers(self):
        """This rank's buffers in plan order: [{"group", "role", "dtype",
        "elements", "aliases"}] (aliases: None or "main_weight")."""
        return self._core.buffers

    # -- memory ---------------------------------------------------------------
    def allocate(self):
        """Runtime-owned buffers for every (group, role), zeroed, on the
        checkpointer's device; replaces every binding."""
        self._core.allocate()
        self._bound.clear()
        self._records.clear()

    def bind(self, group, role, tensor):
        """The caller's memory for one buffer, no copy: a torch tensor or any
        DLPack object of the buffer's dtype, exactly its elements,
        contiguous, on the checkpointer's device (ValueError otherwise;
        TypeError for anything else). The object is kept alive while bound."""
        torch = _torch()
        exported = tensor
        record = None
        if torch is not None and isinstance(tensor, torch.Tensor):
            _check_torch_tensor(self, group, role, tensor)
            record = _Bound(tensor)
            self._refuse_overlap(int(group), str(role), record)
            exported = tensor.detach()
        elif not (hasattr(tensor, "__dlpack__") or _is_capsule(tensor)):
            raise TypeError(f"bind takes a torch tensor or a DLPack object, not "
                            f"{type(tensor).__name__}")
        try:
            self._core.bind(int(group), str(role), exported)
        except TypeError as error:
            if "incompatible function arguments" in str(error):
                raise TypeError(f"bind: cannot import {type(tensor).__name__} through DLPack")
            raise
        self._bound[(int(group), str(role))] = tensor
        if record is not None:
            self._records[(int(group), str(role))] = record
        else:
            self._records.pop((int(group), str(role)), None)

    def _refuse_overlap(self, group, role, record):
        """Two roles in one memory would save one as the other: refused, but for a model_weight
        that aliases main_weight (the plan's own sharing)."""
        aliased = {(b["group"], b["role"]) for b in self.buffers if b.get("aliases")}
        for (g, r), other in self._records.items():
            if (g, r) == (group, role) or not record.overlaps(other):
                continue
            if g == group and {r, role} == {"main_weight", "model_weight"} and (
                    (g, "model_weight") in aliased):
                continue
            raise ValueError(f"bind: group {group} {role} overlaps the memory bound as group {g} "
                             f"{r}: every buffer needs memory of its own")

    def _check_bindings(self, what):
        """Every bound torch tensor still holds the memory bind saw: torch may free it
        (untyped_storage().resize_(0), as FSDP does to parameters) or re-point it (t.data =
        other); the runtime would then read or write memory that is not the tensor's."""
        for (group, role), record in self._records.items():
            why = record.changed()
            if why:
                raise ValueError(f"{what}: the tensor bound as group {group} {role} {why} since "
                                 "bind: bind it again")

    def _agreed_checks(self, what, checks):
        """Runs `checks` on every rank of a collective and agrees on the outcome: when they
        fail on any rank, every rank raises (a failing rank its own error, the others the
        first failing rank's), so that no rank enters the collective alone and waits for the
        others forever. Returns what `checks` returned."""
        try:
            checked, failure = checks(), None
        except (ValueError, TypeError) as e:
            checked, failure = None, e
        try:
            self._core.agree("" if failure is None else f"{what}: {type(failure).__name__}: "
                             f"{failure}")
        except Exception:
            if failure is not None:
                raise failure from None
            raise
        return checked

    def tensor(self, group, role):
        """A torch tensor over one buffer (1-D, no copy); it keeps the
        memory alive."""
        torch = _torch()
        if torch is None:
            raise ImportError("Checkpointer.tensor needs torch; dlpack(group, role) does not")
        self._check_bindings("tensor")
        return torch.from_dlpack(self._core.view(int(group), str(role)))

    def dlpack(self, group, role):
        """One buffer as a DLPack-capable object (no copy)."""
        return self._core.view(int(group), str(role))

    # -- test values ----------------------------------------------------------
    def fill(self, seed):
        """The deterministic test values of seed (docs/TestValues.md) in every buffer."""
        self._check_bindings("fill")
        self._sync_device()
        self._core.fill(_seed(seed))

    def check(self, seed):
        """Raises CheckpointError on the first element that differs from
        seed's value (collective: every rank gets the first failure)."""
        self._collective("check")
        self._check_bindings("check")
        self._sync_device()
        self._core.check(_seed(seed))

    def refresh_model_weights(self, group=None):
        """model_weight = main_weight cast to model_weight's dtype (round to
        nearest even), as load(sync_model_weights=True) does: in every group
        with a model_weight of its own, or in `group` alone. This rank only."""
        self._check_bindings("refresh_model_weights")
        self._sync_device()
        self._core.refresh_model_weights(-1 if group is None else int(group))
        self._sync_device()

    # -- save and load --------------------------------------------------------
    def save(self, dir, overwrite=False, step=1.0, *, progress=None, threads=0,
             buffered_io=False, live_items=None, replace_planned_bytes=False, model_only=False):
        """Saves every rank's buffers into `dir` (collective); returns this
        rank's stats: {"rank", "bytes", "items", "seconds", "stall_seconds",
        "bytes_read_storage", "bytes_written_storage", "bytes_from_peers"}.

        live_items: what the plan does not know, as it is at this save: a
        sequence of (key, value) or (key, value, path), value a complete
        torch.save archive (bytes, bytearray, memoryview: a bytes item, as
        DCP saves a non-tensor) or a torch tensor (any device; saved as a
        C-contiguous CPU tensor), path the key's nesting (a tuple of str and
        int; default: the key alone). Only the committing rank's
        (commit_rank) are written; the others' are checked and ignored.
        replace_planned_bytes: drop the plan's optimizer.param_groups.0.*
        (the live items then give every param group). model_only: save the
        model.* keys alone (and the live items): no optimizer state, about a
        third of the bytes with Adam; load it with exclude=["optimizer"]."""
        self._collective("save")
        live = self._agreed_checks("save", lambda: (
            self._check_bindings("save"), _live_items(live_items, self.rank == self.commit_rank))[1])
        self._sync_device()
        bar = _Progress(progress, "save")
        try:
            return self._core.save(os.fspath(dir), bool(overwrite), float(step),
                                   _threads(threads), bool(buffered_io), bar.callback, live,
                                   bool(replace_planned_bytes), _MODEL if model_only else [])
        finally:
            bar.close()

    def save_async(self, dir, overwrite=False, step=1.0, *, progress=None, threads=0,
                   buffered_io=False, live_items=None, replace_planned_bytes=False,
                   model_only=False):
        """Starts a save and returns once every byte it saves is copied to
        host memory (the buffers may change from then on; live_items, as
        for save, are copied too); the writes and the commit run in the
        background. Returns a SaveHandle: wait()."""
        self._collective("save_async")
        live = self._agreed_checks("save_async", lambda: (
            self._check_bindings("save_async"),
            _live_items(live_items, self.rank == self.commit_rank))[1])
        self._sync_device()
        bar = _Progress(progress, "save")
        try:
            handle = self._core.save_async(os.fspath(dir), bool(overwrite), float(step),
                                           _threads(threads), bool(buffered_io), bar.callback,
                                           live, bool(replace_planned_bytes),
                                           _MODEL if model_only else [])
        except BaseException:
            bar.close()
            raise
        return SaveHandle(handle, bar, self)

    def load(self, dir, sync_model_weights=True, *, progress=None, threads=0,
             verify_checksums=True, source="dcp", key_map=None, only=None, exclude=None,
             direct_reads=True):
        """Loads `dir` (any DCP checkpoint, any saved layout) into this
        plan's layout (collective); returns this rank's stats, "step" (the
        optimizer step found, or None), "bytes_items" ({key: bytes}: every
        bytes item's torch.save archive; torch.load(io.BytesIO(b)) reads
        one) and "tensor_items" ({key: CPU tensor}: every tensor the plan
        does not save, saved as one chunk: live tensor items whatever their size (up to the
        1 GiB a live item holds), another writer's up to 64 MiB).

        only / exclude (lists of key prefixes: "model", "optimizer") load
        some keys and leave the others' buffers as they are.

        source="hf": `dir` is a Hugging Face model directory
        (model.safetensors, or the shards model.safetensors.index.json
        names): each rank reads the byte ranges of its own pieces, cast to
        the main-weight dtype; the optimizer state is zeroed and "step" is
        0. Its tensor names are FQNs; key_map renames them: a dict {name:
        fqn or None (left out)}, or a callable name -> fqn or None.

        direct_reads=False reads a DCP checkpoint's cold ranges through the
        page cache (default: ranges of 16 MiB and more with direct I/O)."""
        self._collective("load")
        self._agreed_checks("load", lambda: self._check_bindings("load"))
        if source not in ("dcp", "hf"):
            raise ValueError(f"load: source must be 'dcp' or 'hf', not {source!r}")
        if source == "hf" and (only or exclude):
            raise ValueError("load: only/exclude select keys of a DCP checkpoint; a Hugging "
                             "Face model holds the model's weights alone")
        if source == "dcp" and key_map is not None:
            raise ValueError("load: key_map renames the tensors of a Hugging Face model "
                             "(source='hf')")
        path = os.fspath(dir)
        names = _hf_names(path, key_map) if source == "hf" else None
        self._sync_device()
        bar = _Progress(progress, "load")
        try:
            if source == "hf":
                result = self._core.load_hf(path, names, [], bool(sync_model_weights),
                                            _threads(threads), bar.callback)
                result.update(bytes_items={}, tensor_items={})
            else:
                result = self._core.load(path, bool(sync_model_weights), _threads(threads),
                                         bool(verify_checksums), bar.callback,
                                         _prefixes(only, "load: only"),
                                         _prefixes(exclude, "load: exclude"),
                                         bool(direct_reads))
        finally:
            bar.close()
        self._sync_device()
        result["tensor_items"] = {key: _tensor_of(*raw)
                                  for key, raw in result["tensor_items"].items()}
        return result

    def reshard(self, source, target, *, overwrite=False, drop=(), allow_extra=False,
                progress=None, threads=0):
        """Loads `source` (any DCP checkpoint: ours, PyTorch's, Megatron-FSDP's) into this
        plan's layout and saves it into `target` (collective), as `fsdp-ckpt reshard`: every
        item of the source the plan does not name (further param groups, `initial_lr`, an LR
        scheduler's or a train loop's state, RNG states, small tensors) is carried into
        `target`, unless a `drop` prefix names it. A source tensor the plan does not name that
        is too large or chunked to carry raises Incompatible unless allow_extra=True (then it
        is left out). The buffers hold the source's values afterwards. Returns this rank's
        stats with "carried" and "dropped" (the source keys kept besides the plan's and those
        left out; on the committing rank, empty elsewhere)."""
        self._collective("reshard")
        self._agreed_checks("reshard", lambda: self._check_bindings("reshard"))
        self._sync_device()
        bar = _Progress(progress, "reshard")
        try:
            return self._core.reshard(os.fspath(source), os.fspath(target), bool(overwrite),
                                      _threads(threads), bar.callback,
                                      _prefixes(drop, "reshard: drop"), bool(allow_extra))
        finally:
            bar.close()
            self._sync_device()

    def reserve_snapshot(self, threads=0):
        """Reserves the async save's host snapshot now and faults it in on
        `threads` threads (0: the default count); else the first save_async
        does."""
        self._core.reserve_snapshot(_threads(threads))

    def reserve_write_blocks(self, threads=0):
        """Reserves now the blocks a save with `threads` workers writes from
        (8 MiB for each worker and each of 8 writes in flight; 0: the
        default count). Every save keeps them for the next, so without this
        only the first save pays for them."""
        self._core.reserve_write_blocks(_threads(threads))

    def wait(self):
        """Waits for a save still running in the background."""
        self._core.wait_for_pending_save()

    # -- helpers --------------------------------------------------------------
    def _collective(self, what):
        if self._detached:
            raise ValueError(
                f"{what}: rank {self.rank} of {self.world_size} has no communicator (comm=None): "
                "pass comm=\"mpi\" or a torch.distributed process group")

    def _sync_device(self):
        # The runtime's copies run on its own CUDA streams: the caller's
        # kernels on its tensors finish first.
        device = self._core.device
        if device and device.startswith("cuda"):
            torch = _torch()
            if torch is not None and torch.cuda.is_available():
                torch.cuda.synchronize(device)

    def __repr__(self):
        return (f"fsdp_mlir.Checkpointer(plan={self.plan!r}, rank={self.rank}, "
                f"world_size={self.world_size}, device={self.device!r})")


#: What a model-only save keeps.
_MODEL = ["model"]


def _prefixes(prefixes, what):
    """A list of key prefixes ("model", "optimizer."): a string is one."""
    if prefixes is None:
        return []
    if isinstance(prefixes, str):
        prefixes = [prefixes]
    out = []
    for prefix in prefixes:
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"{what} takes non-empty key prefixes, not {prefix!r}")
        out.append(prefix)
    return out


def _hf_names(path, key_map):
    """key_map as the runtime takes it: {name in the files: FQN, "" for left out}."""
    if key_map is None:
        return {}
    if isinstance(key_map, dict):
        pairs = key_map.items()
    elif callable(key_map):
        pairs = [(name, key_map(name)) for name in _core.hf_tensors(path)]
    else:
        raise TypeError("load: key_map is a dict {name: fqn or None} or a callable "
                        f"name -> fqn or None, not {type(key_map).__name__}")
    names = {}
    for name, fqn in pairs:
        if fqn is not None and (not isinstance(fqn, str) or not fqn):
            raise ValueError(f"load: key_map gives {name!r} the FQN {fqn!r}: a non-empty "
                             "string, or None to leave it out")
        names[str(name)] = fqn or ""
    return names


def _live_items(items, convert):
    """save's live_items as the extension takes them: [(key, dtype name or
    None, shape, data, path)]. Checked on every rank; the data converted only
    where `convert` (the committing rank), else none are passed."""
    if items is None:
        return []
    if isinstance(items, (str, bytes, dict)) or not hasattr(items, "__iter__"):
        raise TypeError("live_items must be a sequence of (key, value) or (key, value, path), "
                        f"not {type(items).__name__}")
    torch = _torch()
    out = []
    for entry in items:
        if not isinstance(entry, (tuple, list)):
            raise TypeError("live_items: each item must be a (key, value) or (key, value, path) "
                            f"tuple, not {type(entry).__name__}")
        if len(entry) not in (2, 3):
            raise ValueError("live_items: each item must be (key, value) or (key, value, path), "
                             f"not {len(entry)} values")
        key, value = entry[0], entry[1]
        path = entry[2] if len(entry) == 3 else ()
        if not isinstance(key, str):
            raise TypeError(f"live_items: a key must be a str, not {type(key).__name__}")
        if not key:
            raise ValueError("live_items: a key must not be empty")
        if path is None:
            path = ()
        if not isinstance(path, (tuple, list)):
            raise TypeError(f"live item {key!r}: the path must be a tuple of str and int, not "
                            f"{type(path).__name__}")
        for part in path:
            if isinstance(part, bool) or not isinstance(part, (str, int)):
                raise TypeError(f"live item {key!r}: a path part must be a str or an int, not "
                                f"{type(part).__name__}")
        if isinstance(value, (bytes, bytearray, memoryview)):
            item = (key, None, (), bytes(value) if convert else b"", tuple(path))
        elif torch is not None and isinstance(value, torch.Tensor):
            if value.is_sparse or value.layout != torch.strided:
                raise ValueError(f"live item {key!r}: a strided (dense) tensor is needed, not "
                                 f"{value.layout}")
            dtype = str(value.dtype).replace("torch.", "")
            if dtype not in _core.dtype_names:
                raise ValueError(f"live item {key!r}: a checkpoint cannot hold {value.dtype}")
            item = (key, dtype, tuple(value.shape), _tensor_bytes(value) if convert else b"",
                    tuple(path))
        else:
            raise TypeError(f"live item {key!r}: the value must be bytes (a torch.save archive) "
                            f"or a torch tensor, not {type(value).__name__}")
        out.append(item)
    return out if convert else []


def _tensor_bytes(tensor):
    """The raw little-endian elements of a tensor in C order, from the host."""
    import ctypes
    import sys

    if sys.byteorder != "little":  # pragma: no cover
        raise ValueError("live tensor items need a little-endian host")
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    size = flat.numel() * flat.element_size()
    return ctypes.string_at(flat.data_ptr(), size) if size else b""


def _tensor_of(dtype, shape, data):
    """A CPU tensor of `dtype` and `shape` over its raw elements (`data`: a uint8 array over
    the memory the load read them into, no copy)."""
    torch = _torch()
    if torch is None:  # pragma: no cover
        raise ImportError("load's tensor_items need torch")
    kind = getattr(torch, dtype)
    flat = torch.from_dlpack(data)
    if flat.numel() == 0:
        return torch.empty(tuple(shape), dtype=kind)
    return flat.view(kind).reshape(tuple(shape))


def _seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an integer in [0, 2^31), not {seed!r}")
    return seed


def _device_name(device):
    text = str(device)
    if text not in ("cpu", "cuda") and not text.startswith("cuda:"):
        raise ValueError(f"device must be cpu, cuda or cuda:N, not {device!r}")
    return text


def _is_process_group(obj):
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False
    if not dist.is_available():
        return False
    return isinstance(obj, dist.ProcessGroup) or obj is dist.group.WORLD


class _Bound:
    """What bind saw of a torch tensor, to tell at each call whether it still holds that
    memory."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.ptr = tensor.data_ptr()
        self.nbytes = tensor.numel() * tensor.element_size()
        self.device = tensor.device
        self.dtype = tensor.dtype

    def overlaps(self, other):
        return (self.device == other.device and self.nbytes and other.nbytes and
                self.ptr < other.ptr + other.nbytes and other.ptr < self.ptr + self.nbytes)

    def changed(self):
        t = self.tensor
        if t.device != self.device or t.dtype != self.dtype:
            return f"is now {t.dtype} on {t.device} (was {self.dtype} on {self.device})"
        storage = t.untyped_storage()
        if storage.nbytes() < t.storage_offset() * t.element_size() + self.nbytes:
            return (f"has lost its memory (its storage holds {storage.nbytes()} bytes, "
                    f"{self.nbytes} are bound: resize_(0) frees it)")
        if t.data_ptr() != self.ptr:
            return "points at other memory (t.data was replaced, or its storage reallocated)"
        return None


def _threads(threads):
    """threads as the CLI takes them: 0 (the default) to 1024, an integer."""
    try:
        count = operator.index(threads) if not isinstance(threads, bool) else None
    except TypeError:
        count = None
    if count is None or not 0 <= count <= 1024:
        raise ValueError(f"threads must be an integer from 0 (the default) to 1024, not "
                         f"{threads!r}")
    return count


def _check_torch_tensor(checkpointer, group, role, tensor):
    """bind's checks with torch's words (the extension checks again)."""
    wanted = None
    for buffer in checkpointer.buffers:
        if buffer["group"] == group and buffer["role"] == role:
            wanted = buffer
    if wanted is None:
        return  # the extension names the missing buffer
    name = f"group {group} {role}"
    dtype = str(tensor.dtype).replace("torch.", "")
    if dtype != wanted["dtype"]:
        raise ValueError(f"{name} holds {wanted['dtype']}, not {dtype}")
    if tensor.numel() != wanted["elements"]:
        raise ValueError(f"{name} has {wanted['elements']} elements, not {tensor.numel()}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name}: the tensor is not contiguous")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: tensors on {tensor.device} are not supported (cpu or cuda)")
    if tensor.device.type == "cuda" and not _core.cuda_built:
        raise ValueError(f"{name}: a CUDA tensor needs CUDA, and this build of fsdp_mlir has "
                         "none (the runtime was built without a CUDA toolkit): bind CPU tensors")


_mpi_global = False


def _make_mpi_global():
    """Open MPI loads its plugins expecting libmpi's symbols to be global;
    a Python extension's libraries are loaded local. Reload libmpi global
    (once) before MPI is initialized."""
    global _mpi_global
    if _mpi_global or not _core.mpi_built:
        return
    _mpi_global = True
    import ctypes
    import ctypes.util

    for name in ("libmpi.so.40", "libmpi.so.12", ctypes.util.find_library("mpi")):
        if not name:
            continue
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue
