"""fm.CheckpointManager: a job's step-<N> checkpoints, the newest good one found after crashes
(a save killed at each phase, a prune killed mid-removal), retention that never deletes a good
newest checkpoint, async saves one at a time, and a Megatron-FSDP job resumed from latest()."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import fsdp_mlir as fm

torch = pytest.importorskip("torch")


@pytest.fixture
def plan1(plans):
    return plans("worked-example", 1)


def _ck(plan):
    c = fm.Checkpointer(plan)
    c.allocate()
    return c


def test_steps_latest_and_retention(tmp_path, plan1):
    ck = _ck(plan1)
    manager = fm.CheckpointManager(tmp_path / "job", keep_latest_k=2)
    assert manager.latest() is None and manager.steps() == []
    for step in (1, 2, 3, 4):
        ck.fill(step)
        manager.save(ck, step=step)
    assert manager.steps() == [3, 4]
    assert manager.latest() == str(tmp_path / "job" / "step-4")
    ck.fill(0)
    ck.load(manager.latest())
    ck.check(4)
    # keep_latest_k=None keeps all; prune(keep=1) on demand.
    everything = fm.CheckpointManager(tmp_path / "job", keep_latest_k=None)
    ck.fill(5)
    everything.save(ck, step=5)
    assert everything.steps() == [3, 4, 5]
    assert everything.prune(keep=1) == [str(tmp_path / "job" / f"step-{s}") for s in (3, 4)]
    assert everything.steps() == [5]


def test_damaged_and_uncommitted_are_never_chosen_nor_deleted(tmp_path, plan1):
    ck = _ck(plan1)
    root = tmp_path / "job"
    manager = fm.CheckpointManager(root, keep_latest_k=1)
    ck.fill(1)
    manager.save(ck, step=1)
    ck.fill(2)
    manager.save(ck, step=2)
    assert manager.steps() == [2]
    # A newer checkpoint whose .metadata is damaged, a staging directory and a claimed target.
    ck.fill(3)
    ck.save(root / "step-3")
    with open(root / "step-3" / ".metadata", "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xff")
    (root / "step-4.fsdp-staging").mkdir()
    (root / "step-4.fsdp-staging" / ".metadata").write_bytes(b"x")
    (root / "notes").mkdir()
    assert manager.latest() == str(root / "step-2")
    ck.fill(5)
    manager.save(ck, step=5)
    # step-2 was the newest good one before step-5; now only step-5 is kept of the good ones,
    # the damaged step-3 and the staging directory stay as they are.
    assert manager.steps() == [3, 5]
    assert (root / "step-4.fsdp-staging").is_dir() and (root / "notes").is_dir()
    assert manager.latest() == str(root / "step-5")


def test_bad_arguments(tmp_path):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="keep_latest_k"):
            fm.CheckpointManager(tmp_path / "a", keep_latest_k=bad)
    with pytest.raises(ValueError, match="policy"):
        fm.CheckpointManager(tmp_path / "a", policy="later")
    manager = fm.CheckpointManager(tmp_path / "a")
    with pytest.raises(ValueError, match="step must be"):
        manager.path(-3)


_KILLED = textwrap.dedent("""
    import os, signal, shutil, sys
    import fsdp_mlir as fm
    plan, root, phase, step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ck = fm.Checkpointer(plan)
    ck.allocate()
    ck.fill(step)
    manager = fm.CheckpointManager(root, keep_latest_k=2)
    kill = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if phase == "writing":
        manager.save(ck, step=step, progress=lambda done, total: kill())
    elif phase == "pruning":
        # The runtime's prune, killed just before its first rename away.
        import subprocess
        ck.save(manager.path(step))
        subprocess.run([fm.find_tool("fsdp-ckpt"), "prune", root, "--keep", "2",
                        "--inject-fault", "rename:1:KILL"])
        kill()
    elif phase == "committed":
        ck.save(manager.path(step))
        kill()
""")


@pytest.mark.parametrize("phase", ["writing", "committed", "pruning"])
def test_killed_at_every_phase_latest_is_good(tmp_path, plan1, phase):
    """SIGKILL while the save writes, after its commit before retention, and in retention
    before its first removal: latest() is always a good checkpoint with the values it was saved
    with, and nothing good is lost."""
    ck = _ck(plan1)
    root = tmp_path / "job"
    manager = fm.CheckpointManager(root, keep_latest_k=2)
    for step in (1, 2):
        ck.fill(step)
        manager.save(ck, step=step)
    script = tmp_path / "killed.py"
    script.write_text(_KILLED)
    run = subprocess.run([sys.executable, str(script), str(plan1), str(root), phase, "3"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    again = fm.CheckpointManager(root, keep_latest_k=2)  # removes what a killed prune left
    latest = again.latest()
    expected = 2 if phase == "writing" else 3
    assert latest == str(root / f"step-{expected}")
    ck.fill(0)
    ck.load(latest)
    ck.check(expected)
    # Every checkpoint still named step-<N> is whole, and the newest two good ones are there.
    for step in again.steps():
        fm.verify(again.path(step))
    assert again.steps()[-2:] == ([1, 2] if phase == "writing" else [2, 3])
    assert not [n for n in os.listdir(root) if n.endswith(".deleting")]


def _two_steps_saved(tmp_path, plan1):
    """A checkpointer, a manager that keeps one and its job root, with step-1 and step-2 saved
    straight to their paths (no retention yet)."""
    ck = _ck(plan1)
    root = tmp_path / "job"
    manager = fm.CheckpointManager(root, keep_latest_k=1)
    for step in (1, 2):
        ck.fill(step)
        ck.save(manager.path(step))
    return ck, manager, root


def test_a_removal_cut_short_is_finished(tmp_path, plan1):
    """A crash inside a removal (after its rename away) leaves a part of `.step-<N>.deleting`:
    never taken for a checkpoint, and removed by the next prune."""
    ck, manager, root = _two_steps_saved(tmp_path, plan1)
    os.rename(manager.path(1), root / ".step-1.deleting")
    os.remove(root / ".step-1.deleting" / ".metadata")
    assert manager.steps() == [2] and manager.latest() == manager.path(2)
    assert manager.prune() == []
    assert sorted(os.listdir(root)) == ["step-2"]


def test_async_saves_one_at_a_time(tmp_path, plan1):
    ck = _ck(plan1)
    manager = fm.CheckpointManager(tmp_path / "job", keep_latest_k=2, async_save=True)
    for step in (1, 2, 3):
        ck.fill(step)
        handle = manager.save(ck, step=step)
        assert handle is not None
        ck.fill(100 + step)  # the buffers may change once save_async returns
    manager.wait()
    assert manager.steps() == [2, 3]
    ck.fill(0)
    ck.load(manager.latest())
    ck.check(3)
    skipping = fm.CheckpointManager(tmp_path / "skip", async_save=True, policy="skip")
    ck.fill(7)
    first = skipping.save(ck, step=1)
    second = skipping.save(ck, step=2)  # skipped while the first runs, or run after it
    skipping.wait()
    assert first is not None
    assert skipping.steps() == ([1] if second is None else [1, 2])


def _megatron_job(world):
    import megatron_cpu as mc
    mc.install()
    model, opt = mc.build(world, two_groups=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    return mc, model, opt, sched


def train_and_keep_worker(rank, world, port, root, out):
    """Three steps of a Megatron-FSDP job, a checkpoint after each through the manager (keep 2):
    every rank agrees on what is kept."""
    mc, model, opt, sched = _megatron_job(world)
    manager = fm.CheckpointManager(root, keep_latest_k=2)
    for step in range(3):
        mc.train_step(model, opt, step, world, rank, scheduler=sched)
        manager.save_checkpoint(model, opt, step=step + 1, extra={"lr_scheduler": sched})
    assert manager.steps() == [2, 3]
    assert manager.latest() == os.path.join(root, "step-3")
    snap = mc.snapshot(model, opt)
    snap["scheduler"] = sched.state_dict()
    torch.save(snap, f"{out}.{rank}")


def resume_latest_worker(rank, world, port, root, out):
    mc, model, opt, sched = _megatron_job(world)
    manager = fm.CheckpointManager(root, keep_latest_k=2)
    step, report = manager.load_latest(model, opt, extra={"lr_scheduler": sched})
    assert step == 3 and report == {}
    snap = mc.snapshot(model, opt)
    snap["scheduler"] = sched.state_dict()
    saved = torch.load(f"{out}.{rank}", weights_only=False)
    diff = mc.differences(saved, snap)
    assert not diff, diff[:5]


def test_a_megatron_job_resumes_from_latest(tmp_path, monkeypatch):
    pytest.importorskip("megatron_fsdp")
    import torch_packing as tp
    monkeypatch.setenv("FSDP_MLIR_CACHE", str(tmp_path / "plans"))
    root, out = str(tmp_path / "job"), str(tmp_path / "snap")
    tp.spawn(train_and_keep_worker, 2, root, out)
    tp.spawn(resume_latest_worker, 2, root, out)
    fresh = fm.CheckpointManager(tmp_path / "empty")
    assert fresh.load_latest(None, None) is None


def _damage(directory, kind):
    """Breaks what a load of `directory` needs, as a lost or cut file or a flipped byte does."""
    files = sorted(n for n in os.listdir(directory) if n.endswith(".distcp"))
    if kind == "missing":
        os.remove(os.path.join(directory, files[-1]))
    elif kind == "truncated":
        path = os.path.join(directory, files[-1])
        os.truncate(path, os.path.getsize(path) - 100)
    elif kind == "chunk-records":
        path = os.path.join(directory, ".fsdp-chunks")
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 40)  # the last record, past the directory
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x5A]))


@pytest.mark.parametrize("kind", ["missing", "truncated", "chunk-records"])
def test_a_newest_that_cannot_load_is_not_latest_nor_kept_for_good(tmp_path, plan1, kind):
    """The newest step-<N> lost a data file, has a truncated one or a damaged chunk index:
    latest() is the one before it, and retention keeps that one (nothing left to resume from
    was the defect)."""
    ck, manager, root = _two_steps_saved(tmp_path, plan1)
    _damage(manager.path(2), kind)
    listed = {c["step"]: c for c in manager.checkpoints()}
    assert listed[1]["good"] and not listed[2]["good"], listed
    assert listed[2]["problem"]
    with pytest.raises(fm.CheckpointError):
        ck.load(manager.path(2))
    assert manager.latest() == manager.path(1)
    assert manager.prune() == []
    assert manager.steps() == [1, 2]
    ck.fill(0)
    ck.load(manager.latest())
    ck.check(1)


def test_model_only_checkpoints_and_the_newest_full_one(tmp_path, plan1):
    ck = _ck(plan1)
    manager = fm.CheckpointManager(tmp_path / "job", keep_latest_k=1)
    ck.fill(1)
    manager.save(ck, step=1)
    ck.fill(2)
    manager.save(ck, step=2, model_only=True)
    # The model-only one is the newest good one; the full one stays for a resume.
    assert manager.latest() == manager.path(2)
    assert manager.latest(full=True) == manager.path(1)
    assert manager.steps() == [1, 2]
    assert [c["full"] for c in manager.checkpoints()] == [True, False]
    ck.fill(3)
    manager.save(ck, step=3)
    assert manager.steps() == [3] and manager.latest(full=True) == manager.path(3)


def test_steps_and_counts_are_bounded(tmp_path, plan1):
    manager = fm.CheckpointManager(tmp_path / "job", keep_latest_k=10**6)
    assert manager.path(10**18 - 1).endswith("step-999999999999999999")
    ck = _ck(plan1)
    for bad in (10**18, 2**70, -1):
        with pytest.raises(ValueError, match="step must be an integer from 0 to"):
            manager.save(ck, step=bad)
    assert manager.steps() == []
    for bad in (2**70, 10**6 + 1):
        with pytest.raises(ValueError, match="keep_latest_k must be an integer from 1 to"):
            fm.CheckpointManager(tmp_path / "job", keep_latest_k=bad)
    for bad in (0, 2**70):
        with pytest.raises(ValueError, match="keep must be an integer from 1 to"):
            manager.prune(keep=bad)
    # The largest step is a step of the job like any other.
    ck.fill(4)
    manager.save(ck, step=10**18 - 1)
    assert manager.latest() == manager.path(10**18 - 1)


_MPI_JOB = textwrap.dedent("""
    import os, sys
    import fsdp_mlir as fm
    plan, root, saves = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ck = fm.Checkpointer(plan, comm="mpi")
    ck.allocate()
    manager = fm.CheckpointManager(root, keep_latest_k=1)  # MPI_COMM_WORLD: found by itself
    for step in range(1, saves + 1):
        ck.fill(step)
        manager.save(ck, step=step)
        assert manager.steps() == [step], (ck.rank, step, manager.steps())
    assert manager.latest() == manager.path(saves)
    # Ranks that name different roots are refused on every rank.
    try:
        fm.CheckpointManager(f"{root}-{ck.rank}")
    except ValueError as e:
        print(f"rank {ck.rank} refused: {e}", flush=True)
    print(f"rank {ck.rank} ok", flush=True)
""")


def test_mpi_ranks_decide_once(tmp_path, plans):
    """The ranks of an MPI job (comm="mpi", no torch.distributed): rank 0 alone decides
    retention and tells the other; 30 saves with keep 1 never race (they did: NotFound
    .step-N.deleting after the commit, the other rank left waiting)."""
    import shutil
    if not fm.mpi_built or not shutil.which("mpirun"):
        pytest.fail("this test needs MPI (the build has it and mpirun is on PATH in CI)")
    script = tmp_path / "job.py"
    script.write_text(_MPI_JOB)
    root = tmp_path / "job"
    run = subprocess.run(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable,
         str(script), plans("worked-example", 2), str(root), "30"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout
    for rank in (0, 1):
        assert f"rank {rank} ok" in run.stdout, run.stdout
        assert f"rank {rank} refused" in run.stdout, run.stdout
    assert "every rank of a job must name one directory" in run.stdout
    assert sorted(os.listdir(root)) == ["step-30"]


_ONE_OF_TWO_JOBS = textwrap.dedent("""
    import sys
    import fsdp_mlir as fm
    plan, root, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ck = fm.Checkpointer(plan)
    ck.allocate()
    manager = fm.CheckpointManager(root, keep_latest_k=1)
    for step in range(first, first + 40, 2):
        ck.fill(step)
        manager.save(ck, step=step)
""")


def test_two_jobs_on_one_root_take_turns(tmp_path, plan1):
    """Two processes, each its own job, save into one root with keep 1: their prunes take
    turns under the root's lock, so neither fails, and what is left loads."""
    script = tmp_path / "one.py"
    script.write_text(_ONE_OF_TWO_JOBS)
    root = tmp_path / "job"
    jobs = [subprocess.Popen([sys.executable, str(script), str(plan1), str(root), str(first)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for first in (1, 2)]
    for job in jobs:
        out, _ = job.communicate(timeout=300)
        assert job.returncode == 0, out
    manager = fm.CheckpointManager(root, keep_latest_k=1)
    latest = manager.latest()
    assert latest is not None
    step = int(os.path.basename(latest)[len("step-"):])
    assert step >= 39
    ck = _ck(plan1)
    ck.load(latest)
    ck.check(step)
    assert not [n for n in os.listdir(root) if n.endswith(".deleting")]
