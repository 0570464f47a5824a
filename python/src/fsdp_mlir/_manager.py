"""CheckpointManager: one directory per job, a `step-<N>` checkpoint per save, the newest good
one found again after a crash, the last k kept.

What counts as a good checkpoint and what retention removes is the runtime's rule
(include/fsdp/Runtime/JobRoot.h, also `fsdp-ckpt list` / `prune`): a `step-<N>` directory is a
commit, good when a load of it would succeed (`.metadata` agrees with both indexes, the chunk
index is whole, every data file holds its bytes); retention renames away, then removes, good
checkpoints older than the k newest good ones (keeping the newest with optimizer state when newer
ones are model-only), one prune of a root at a time (a lock file in the root). With several
ranks, rank 0 of the manager's communicator looks and decides, and every rank gets its answer:
the torch.distributed world when it is initialised, else MPI_COMM_WORLD under an MPI launcher,
else this process alone (`comm=` picks another).
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, List, Optional

from . import _core

_STEP = re.compile(r"step-(0|[1-9]\d{0,17})")


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _communicator(comm):
    """What the runtime's JobRoot takes for `comm` (None: the job's own, see the module's
    docstring)."""
    if comm is None:
        dist = _dist()
        if dist is not None:
            comm = dist.group.WORLD
        else:
            return "default" if _core.mpi_built else None
    if isinstance(comm, str):
        if comm not in ("mpi", "default"):
            raise ValueError(f"unknown communicator {comm!r} (None, \"mpi\" or a "
                             "torch.distributed process group)")
        from ._checkpointer import _make_mpi_global
        _make_mpi_global()  # before MPI starts, "default" under mpirun included
        return comm
    from ._checkpointer import _is_process_group
    if not _is_process_group(comm):
        raise TypeError("comm must be None, \"mpi\" or a torch.distributed ProcessGroup, not "
                        f"{type(comm).__name__}")
    from ._comm import TorchCommunicator
    return TorchCommunicator.over(comm)


class CheckpointManager:
    """A job's checkpoints under `root`: `save` / `save_checkpoint` write `root/step-<N>`,
    `latest()` is the newest good one, `load_latest` resumes from it, and at most
    `keep_latest_k` (None: all) committed checkpoints are kept.

    async_save=True: saves run in the background; at most one is in flight, and the next
    save first waits for it (policy="wait") or is skipped while it runs (policy="skip": the
    save returns None).
    """

    def __init__(self, root, keep_latest_k: Optional[int] = 3, async_save: bool = False,
                 policy: str = "wait", *, comm=None):
        if keep_latest_k is not None and (isinstance(keep_latest_k, bool) or
                                          not isinstance(keep_latest_k, int) or
                                          not 1 <= keep_latest_k <= _core.max_keep):
            raise ValueError(f"keep_latest_k must be an integer from 1 to {_core.max_keep} or "
                             f"None, not {keep_latest_k!r}")
        if policy not in ("wait", "skip"):
            raise ValueError(f"policy must be 'wait' or 'skip', not {policy!r}")
        self.root = os.fspath(root)
        self.keep_latest_k = keep_latest_k
        self.async_save = bool(async_save)
        self.policy = policy
        self._pending = None  # (handle, step) of the save in flight
        # Collective: rank 0 makes the root; every rank checks it names the same directory.
        self._job = _core.JobRoot(self.root, _communicator(comm))

    # -- where checkpoints are ------------------------------------------------
    def path(self, step: int) -> str:
        return os.path.join(self.root, f"step-{_step(step)}")

    def checkpoints(self) -> List[dict]:
        """Every committed checkpoint under root, oldest first: {"step", "path", "good",
        "problem"}."""
        return _core.list_checkpoints(self.root)

    def steps(self) -> List[int]:
        """The steps of every committed checkpoint under root, oldest first (good or not)."""
        return [c["step"] for c in self.checkpoints()]

    def latest(self, full: bool = False) -> Optional[str]:
        """The newest good checkpoint's path (full=True: the newest with optimizer state, not a
        model-only one), or None. Decided by rank 0; every rank gets its answer."""
        return self._job.latest(bool(full))

    # -- saving ---------------------------------------------------------------
    def save(self, checkpointer, step: int, **options):
        """`checkpointer.save` (or `save_async`) into `step-<N>`, then retention. Returns the
        save's stats (None when skipped), or its handle for an async save."""
        return self._save(step, lambda path: (
            checkpointer.save_async(path, overwrite=True, **options) if self.async_save
            else checkpointer.save(path, overwrite=True, **options)))

    def save_checkpoint(self, model, optimizer, step: int, *, extra=None, **options):
        """fsdp_mlir.torch.save_checkpoint into `step-<N>`, then retention."""
        from .torch import save_checkpoint
        return self._save(step, lambda path: save_checkpoint(
            model, optimizer, path, extra=extra, overwrite=True, async_save=self.async_save,
            **options))

    def load_latest(self, model, optimizer, **options):
        """fsdp_mlir.torch.load_checkpoint from the newest good checkpoint: returns (step,
        report), or None when there is none (a fresh job). With an optimizer, the newest with
        optimizer state unless `exclude` leaves the optimizer out (a model-only checkpoint then
        does)."""
        from .torch import load_checkpoint
        excluded = options.get("exclude") or ()
        if isinstance(excluded, str):
            excluded = [excluded]
        needs_optimizer = optimizer is not None and not any(
            p in ("optimizer", "optimizer.") for p in excluded)
        path = self.latest(full=needs_optimizer)
        if path is None:
            return None
        report = load_checkpoint(model, optimizer, path, **options)
        return int(_STEP.fullmatch(os.path.basename(path)).group(1)), report

    def wait(self):
        """Waits for the save in flight, then applies retention."""
        if self._pending is not None:
            handle, _ = self._pending
            self._pending = None
            handle.wait()
            self.prune()

    def prune(self, keep: Optional[int] = None) -> List[str]:
        """Removes good checkpoints older than the `keep` (default keep_latest_k) newest good
        ones; never a damaged one, a staging directory or the one being written, nor the newest
        with optimizer state. Collective; returns the removed paths on every rank."""
        keep = self.keep_latest_k if keep is None else keep
        if keep is None:
            return []
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= _core.max_keep:
            raise ValueError(f"keep must be an integer from 1 to {_core.max_keep}, not {keep!r}")
        writing = self._pending[1] if self._pending is not None else None
        return list(self._job.prune(keep, writing))

    # -- helpers --------------------------------------------------------------
    def _save(self, step: int, start: Callable[[str], Any]):
        path = self.path(step)
        if self._pending is not None:
            handle, _ = self._pending
            if self.policy == "skip" and not self._job.decide(
                    bool(handle.done()) if self._job.is_decider else False):
                return None
            self.wait()
        result = start(path)
        if self.async_save and result is not None:
            self._pending = (result, _step(step))
            return result
        self.prune()
        return result


def _step(step) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _core.max_step:
        raise ValueError(f"step must be an integer from 0 to {_core.max_step}, not {step!r}")
    return step
