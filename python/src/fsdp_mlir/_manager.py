"""CheckpointManager: one directory per job, a `step-<N>` checkpoint per save, the newest good
one found again after a crash, the last k kept.

What counts as a good checkpoint and what retention removes is the runtime's rule
(include/fsdp/Runtime/JobRoot.h, also `fsdp-ckpt list` / `prune`): a `step-<N>` directory is a
commit, good when its `.metadata` matches its integrity index; retention renames away, then
removes, committed good checkpoints older than the k newest good ones. With several ranks the
committing rank looks and decides, and every rank gets its answer (torch.distributed when it is
initialised).
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, List, Optional

from . import _core

_STEP = re.compile(r"step-(\d{1,18})")


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


class CheckpointManager:
    """A job's checkpoints under `root`: `save` / `save_checkpoint` write `root/step-<N>`,
    `latest()` is the newest good one, `load_latest` resumes from it, and at most
    `keep_latest_k` (None: all) committed checkpoints are kept.

    async_save=True: saves run in the background; at most one is in flight, and the next
    save first waits for it (policy="wait") or is skipped while it runs (policy="skip": the
    save returns None).
    """

    def __init__(self, root, keep_latest_k: Optional[int] = 3, async_save: bool = False,
                 policy: str = "wait"):
        if keep_latest_k is not None and (isinstance(keep_latest_k, bool) or
                                          not isinstance(keep_latest_k, int) or
                                          keep_latest_k < 1):
            raise ValueError(f"keep_latest_k must be a positive integer or None, not "
                             f"{keep_latest_k!r}")
        if policy not in ("wait", "skip"):
            raise ValueError(f"policy must be 'wait' or 'skip', not {policy!r}")
        self.root = os.fspath(root)
        self.keep_latest_k = keep_latest_k
        self.async_save = bool(async_save)
        self.policy = policy
        self._pending = None  # (handle, step) of the save in flight
        if self._is_decider():
            os.makedirs(self.root, exist_ok=True)
        self._barrier()

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

    def latest(self) -> Optional[str]:
        """The newest good committed checkpoint's path, or None. Decided by the committing
        rank; every rank gets its answer."""
        found = None
        if self._is_decider():
            good = [c["path"] for c in self.checkpoints() if c["good"]]
            found = good[-1] if good else None
        return self._agree(found)

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
        """fsdp_mlir.torch.load_checkpoint from `latest()`: returns (step, report), or None when
        there is no good checkpoint (a fresh job)."""
        from .torch import load_checkpoint
        path = self.latest()
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
        """Removes committed checkpoints older than the `keep` (default keep_latest_k) newest
        good ones; never a damaged one, a staging directory or the one being written. Returns
        the removed paths (on the committing rank)."""
        keep = self.keep_latest_k if keep is None else keep
        removed: List[str] = []
        if keep is not None and self._is_decider():
            writing = self._pending[1] if self._pending is not None else None
            removed = _core.prune_checkpoints(self.root, int(keep), writing)
        self._barrier()
        return removed

    # -- helpers --------------------------------------------------------------
    def _save(self, step: int, start: Callable[[str], Any]):
        path = self.path(step)
        if self._pending is not None:
            handle, _ = self._pending
            if self.policy == "skip" and not self._agree(handle.done() if self._is_decider()
                                                         else None):
                return None
            self.wait()
        result = start(path)
        if self.async_save and result is not None:
            self._pending = (result, _step(step))
            return result
        self.prune()
        return result

    def _is_decider(self) -> bool:
        dist = _dist()
        return dist is None or dist.get_rank() == 0

    def _agree(self, value):
        dist = _dist()
        if dist is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _barrier(self):
        dist = _dist()
        if dist is not None:
            dist.barrier()


def _step(step) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, not {step!r}")
    return step

