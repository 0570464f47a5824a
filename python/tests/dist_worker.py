"""One rank of a multi-process test, started the way torchrun starts ranks
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE in the environment) or under
mpirun (scenario "mpi-*"). Usage: dist_worker.py SCENARIO JSON_ARGS.
Exits 0 when the scenario passed on this rank; a failure prints its
traceback."""

import json
import os
import sys
import traceback

import fsdp_mlir as fm


def init_gloo():
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    return dist


def save_then_reshard(args):
    """For every case: every rank of the world saves with the plan for the
    world; then the first `load_ranks` ranks load it with the plan for that
    many (a reshard) over a subgroup and check every value."""
    dist = init_gloo()
    for case in args["cases"]:
        _save_then_reshard(dist, case)
    dist.destroy_process_group()


def _save_then_reshard(dist, args):
    import torch

    ck = fm.Checkpointer(args["save_plan"], rank=dist.get_rank(),
                         world_size=dist.get_world_size(), comm=dist.group.WORLD)
    assert ck.rank == dist.get_rank() and ck.world_size == dist.get_world_size()
    # Caller-owned torch tensors for every buffer.
    tensors = {}
    for b in ck.buffers:
        if b["aliases"]:
            continue
        t = torch.empty(b["elements"], dtype=getattr(torch, b["dtype"]))
        ck.bind(b["group"], b["role"], t)
        tensors[(b["group"], b["role"])] = t
    ck.fill(args["seed"])
    if args.get("async"):
        handle = ck.save_async(args["dir"], step=args["step"])
        # Training goes on: the buffers change at once.
        for t in tensors.values():
            t.fill_(1)
        stats = handle.wait()
        assert handle.done()
    else:
        stats = ck.save(args["dir"], step=args["step"])
    assert stats["rank"] == dist.get_rank() and stats["bytes"] > 0, stats
    dist.barrier()

    load_ranks = args["load_ranks"]
    members = list(range(load_ranks))
    # Every rank takes part in making the group (new_group over the world).
    group = dist.new_group(members)
    if dist.get_rank() in members:
        ck2 = fm.Checkpointer(args["load_plan"], rank=dist.get_rank(), world_size=load_ranks,
                              comm=group)
        ck2.allocate()
        result = ck2.load(args["dir"])
        assert result["step"] == args["step"], result
        ck2.check(args["seed"])
        # A wrong seed fails on every rank of the group.
        try:
            ck2.check(args["seed"] + 1)
        except fm.CheckpointError:
            pass
        else:
            raise AssertionError("check of a wrong seed passed")
        # A missing checkpoint is NotFound on every rank.
        try:
            ck2.load(args["dir"] + "-missing")
        except fm.NotFound:
            pass
        else:
            raise AssertionError("load of a missing checkpoint passed")
    dist.barrier()


def pairs(args):
    """Four ranks as two groups of two ([0, 1] and [2, 3]): each pair saves
    and loads its own checkpoint over its group, which is part of the world
    (the checkpointer's own group made by the members alone)."""
    dist = init_gloo()
    rank = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    ck = fm.Checkpointer(args["plan"], comm=mine)
    assert ck.rank == rank % 2 and ck.world_size == 2
    ck.allocate()
    seed = args["seed"] + rank // 2
    ck.fill(seed)
    target = f"{args['dir']}-{rank // 2}"
    ck.save(target)
    ck2 = fm.Checkpointer(args["plan"], comm=mine)
    ck2.allocate()
    ck2.load(target)
    ck2.check(seed)
    dist.barrier()
    dist.destroy_process_group()


def hsdp(args):
    """An HSDP plan (replicate x shard): the load shares reads within each
    replica group, made by the communicator's split."""
    dist = init_gloo()
    ck = fm.Checkpointer(args["plan"], comm=dist.group.WORLD)
    ck.allocate()
    ck.fill(args["seed"])
    ck.save(args["dir"])
    ck2 = fm.Checkpointer(args["plan"], comm=dist.group.WORLD)
    ck2.allocate()
    stats = ck2.load(args["dir"])
    ck2.check(args["seed"])
    # With replicas, some bytes came from a peer instead of storage.
    import torch

    got = torch.tensor([stats["bytes_from_peers"]], dtype=torch.int64)
    dist.all_reduce(got)
    assert int(got) > 0, "no rank received bytes from its replica group"
    dist.destroy_process_group()


def mpi_save_load(args):
    """Under mpirun: comm="mpi" saves and loads (a reshard from the saved
    world to the plan of `load_plan`'s world is left to the gloo tests)."""
    ck = fm.Checkpointer(args["plan"], comm="mpi")
    assert ck.world_size == int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")), ck.world_size
    ck.allocate()
    ck.fill(args["seed"])
    ck.save(args["dir"])
    handle = ck.save_async(args["dir"] + "-async")
    ck.fill(args["seed"] + 1)
    handle.wait()
    ck2 = fm.Checkpointer(args["plan"], comm="mpi")
    ck2.allocate()
    ck2.load(args["dir"])
    ck2.check(args["seed"])
    ck2.load(args["dir"] + "-async")
    ck2.check(args["seed"])
    try:
        ck2.load(args["dir"] + "-missing")
    except fm.NotFound:
        pass
    else:
        raise AssertionError("load of a missing checkpoint passed")


def one_rank_refuses(args):
    """A check that fails on one rank only (its bound tensor freed, or its live items
    malformed) fails the save, async save or load on every rank, none waiting on the
    others; afterwards the same checkpointer saves and loads."""
    import torch

    dist = init_gloo()
    rank = dist.get_rank()
    ck = fm.Checkpointer(args["plan"], comm=dist.group.WORLD)
    bound = {}
    for b in ck.buffers:
        if not b["aliases"]:
            bound[(b["group"], b["role"])] = torch.zeros(b["elements"],
                                                         dtype=getattr(torch, b["dtype"]))
            ck.bind(b["group"], b["role"], bound[(b["group"], b["role"])])
    ck.fill(args["seed"])
    (group, role), victim = next(iter(bound.items()))
    if rank == 1:
        victim.untyped_storage().resize_(0)  # as FSDP frees a parameter, on rank 1 alone
    for what, call in (("save", lambda: ck.save(args["dir"])),
                       ("save_async", lambda: ck.save_async(args["dir"]).wait()),
                       ("load", lambda: ck.load(args["dir"]))):
        try:
            call()
        except ValueError as e:
            expected = "bind it again" if rank == 1 else "rank 1: " + what
            assert expected in str(e), (what, str(e))
        else:
            raise AssertionError(f"{what} passed on rank {rank}")
    if rank == 1:
        victim.untyped_storage().resize_(victim.numel() * victim.element_size())
        ck.bind(group, role, victim)
    ck.fill(args["seed"])
    # Live items that only the committing rank (0) checks in full: malformed there alone.
    bad = [("extra", object())] if rank == 0 else [("extra", torch.zeros(2))]
    try:
        ck.save(args["dir"], live_items=bad)
    except (TypeError, ValueError) as e:
        assert rank == 0 or "rank 0: save" in str(e), str(e)
    else:
        raise AssertionError(f"a save with bad live items passed on rank {rank}")
    ck.save(args["dir"])
    ck.fill(args["seed"] + 1)
    ck.load(args["dir"])
    ck.check(args["seed"])
    dist.destroy_process_group()


SCENARIOS = {
    "one-rank-refuses": one_rank_refuses,
    "save-then-reshard": save_then_reshard,
    "pairs": pairs,
    "hsdp": hsdp,
    "mpi-save-load": mpi_save_load,
}


def main():
    scenario, args = sys.argv[1], json.loads(sys.argv[2])
    try:
        SCENARIOS[scenario](args)
    except BaseException:
        rank = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
        print(f"rank {rank}: scenario {scenario} failed", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
