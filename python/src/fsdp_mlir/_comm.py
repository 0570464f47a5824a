"""A torch.distributed process group as the runtime's communicator.

The runtime needs four collectives (Communicator.h's callbacks): a
fixed-size gather, a broadcast, a barrier and, for HSDP replica groups, a
split. They run here on CPU tensors over a gloo group of the checkpointer's
own, made once over the caller's group's ranks: the runtime calls them from
its own threads (an async save's background thread), and on its own group
they never interleave with the training job's collectives on the caller's
group (which may be NCCL).

The own group is a gloo backend made directly over the job's store (as
torch.distributed.new_group makes one), under a key prefix of ours, rather
than through new_group: new_group over part of the world needs either every
rank of the world to take part or use_local_synchronization, which advances
torch's group counter on the members alone, so a later new_group of the
whole job would name its group differently on members and non-members. Ours
are made by the members alone and leave torch's bookkeeping untouched; the
members agree on the prefix because they make their checkpointers (and
splits) in the same order, as every collective requires.

Buffers arrive as writable memoryviews of bytes, valid during the call; a
tensor is laid over them without a copy.
"""

import collections

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

# How many groups of ours this process made over each tuple of global ranks.
_made = collections.Counter()


def _bytes_tensor(view):
    return torch.frombuffer(view, dtype=torch.uint8)


def _gloo_group(prefix, rank, size):
    store = dist.PrefixStore(prefix + "/", _c10d._get_default_store())
    return dist.ProcessGroupGloo(store, rank, size, _c10d.default_pg_timeout)


class TorchCommunicator:
    """The runtime's callbacks over a gloo group (`backend`, a
    ProcessGroupGloo) whose members are the global ranks `ranks`, in group
    rank order."""

    def __init__(self, backend, ranks, prefix):
        self.backend = backend
        self.ranks = list(ranks)
        self.rank = backend.rank()
        self.size = backend.size()
        self._prefix = prefix
        self._splits = 0

    @classmethod
    def over(cls, process_group):
        """A communicator of its own over the ranks of `process_group`
        (collective over that group: every member must call it)."""
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "comm is a torch.distributed process group but torch.distributed is not "
                "initialized (call torch.distributed.init_process_group first)")
        if process_group is None or process_group is dist.group.WORLD:
            ranks = list(range(dist.get_world_size()))
        else:
            ranks = list(dist.get_process_group_ranks(process_group))
        me = dist.get_rank()
        if me not in ranks:
            raise ValueError("this process is not a member of the given process group")
        key = tuple(ranks)
        _made[key] += 1
        prefix = "fsdp_mlir/{}/{}".format("_".join(map(str, ranks)), _made[key])
        return cls(_gloo_group(prefix, ranks.index(me), len(ranks)), ranks, prefix)

    def gather(self, send, recv, root):
        """`send` of every rank, in rank order, into `recv` on `root`."""
        n = len(send)
        if n == 0:
            return
        options = dist.GatherOptions()
        options.rootRank = root
        outputs = []
        if self.rank == root:
            outputs = [list(_bytes_tensor(recv).view(self.size, n).unbind(0))]
        self.backend.gather(outputs, [_bytes_tensor(send)], options).wait()

    def broadcast(self, buffer, root):
        """`buffer` of `root` into `buffer` on every rank."""
        if len(buffer) == 0:
            return
        options = dist.BroadcastOptions()
        options.rootRank = root
        self.backend.broadcast([_bytes_tensor(buffer)], options).wait()

    def barrier(self):
        self.backend.barrier(dist.BarrierOptions()).wait()

    def split(self, color, key):
        """The ranks passing the same color form a group, ranked by (key,
        rank). Collective: an all-gather of (color, key), then each rank
        joins the group of its color."""
        mine = torch.tensor([color, key], dtype=torch.int64)
        everyone = [torch.empty(2, dtype=torch.int64) for _ in range(self.size)]
        self.backend.allgather([everyone], [mine]).wait()
        pairs = [(int(t[0]), int(t[1])) for t in everyone]
        members = sorted((k, r) for r, (c, k) in enumerate(pairs) if c == color)
        group_ranks = [r for _, r in members]
        self._splits += 1
        prefix = f"{self._prefix}/split{self._splits}/{color}"
        backend = _gloo_group(prefix, group_ranks.index(self.rank), len(group_ranks))
        return TorchCommunicator(backend, [self.ranks[r] for r in group_ranks], prefix)
