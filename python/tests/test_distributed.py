"""Several processes: torch.distributed over gloo (started as torchrun
starts ranks) and MPI (under mpirun)."""

import os
import shutil
import subprocess
import sys

import pytest

import fsdp_mlir as fm
from conftest import WORKER, run_ranks

pytest.importorskip("torch")


def test_save_on_four_load_on_two(tmp_path, plans):
    """Save on 4 ranks over gloo, load into the plan for 2 (a reshard) over
    a subgroup, check every value; for both example models in one world."""
    models = ["worked-example", "llama-tiny"]
    run_ranks(4, "save-then-reshard", {"cases": [{
        "save_plan": plans(model, 4), "load_plan": plans(model, 2),
        "dir": str(tmp_path / model), "seed": 17 + i, "step": 4.0 + i, "load_ranks": 2,
    } for i, model in enumerate(models)]})
    for i, model in enumerate(models):
        assert fm.verify(tmp_path / model)
        # The same checkpoint loads in one process too.
        ck = fm.Checkpointer(plans(model, 1))
        ck.allocate()
        assert ck.load(tmp_path / model)["step"] == 4.0 + i
        ck.check(17 + i)


def test_async_save_on_two_load_on_two(tmp_path, plans):
    """An async save over gloo (its collectives on the runtime's background
    thread) with the buffers overwritten at once; the checkpoint holds the
    old values."""
    run_ranks(2, "save-then-reshard", {"cases": [{
        "save_plan": plans("llama-tiny", 2), "load_plan": plans("llama-tiny", 2),
        "dir": str(tmp_path / "ck"), "seed": 5, "step": 2.0, "load_ranks": 2, "async": True,
    }]})
    assert fm.verify(tmp_path / "ck")


def test_two_groups_of_two(tmp_path, plans):
    """Each half of a 4-process world checkpoints over its own group."""
    run_ranks(4, "pairs", {"plan": plans("worked-example", 2), "dir": str(tmp_path / "ck"),
                           "seed": 3})
    for half in (0, 1):
        ck = fm.Checkpointer(plans("worked-example", 1))
        ck.allocate()
        ck.load(tmp_path / f"ck-{half}")
        ck.check(3 + half)


def test_a_check_failing_on_one_rank_fails_every_rank(tmp_path, plans):
    """A bound tensor freed on one rank, live items malformed on another: the save, async
    save and load raise on both ranks (the other rank names the failing one) instead of one
    rank waiting in the collective alone; then the checkpointer saves and loads."""
    run_ranks(2, "one-rank-refuses", {"plan": plans("worked-example", 2),
                                      "dir": str(tmp_path / "ck"), "seed": 11}, timeout=120)
    assert fm.verify(tmp_path / "ck")


def test_hsdp_replica_groups(tmp_path, plans):
    """An HSDP plan on 4 ranks: the load splits the communicator into
    replica groups (new gloo groups) and shares reads within them."""
    plan = plans("worked-example", mesh="dp_outer=2,dp_shard=2", placements="replicate,shard")
    run_ranks(4, "hsdp", {"plan": plan, "dir": str(tmp_path / "ck"), "seed": 9})


def test_mpi_two_ranks(tmp_path, plans):
    if not fm.mpi_built:
        pytest.skip("this build has no MPI")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun not found")
    import json

    args = {"plan": plans("worked-example", 2), "dir": str(tmp_path / "ck"), "seed": 12}
    done = subprocess.run(
        [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, WORKER,
         "mpi-save-load", json.dumps(args)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout
    assert fm.verify(tmp_path / "ck")
    ck = fm.Checkpointer(plans("worked-example", 1))
    ck.allocate()
    ck.load(tmp_path / "ck")
    ck.check(12)
