"""Resharding a real PyTorch FSDP2 job's DCP checkpoint keeps the whole job: two param groups,
`initial_lr` and an LR scheduler, a train loop's state. The job resumes from the resharded
checkpoint with torch.distributed.checkpoint.load and trains on bit-identically to the run that
never stopped (the reshard used to leave 22 of those items behind, and no job could resume)."""

import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint")

import fsdp_mlir as fm  # noqa: E402
import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402

SAVE_AT, STEPS = 3, 5


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(12, 12) for _ in range(2))
        self.head = torch.nn.Linear(12, 5)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def optimizer_for(model):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    plain = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": plain, "weight_decay": 0.0, "lr": 3e-3}], lr=1e-2)


def fsdp2_job(world):
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    model = Net()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = optimizer_for(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    return model, opt, sched


def train_step(model, opt, sched, step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 12, generator=g), torch.randn(8, 5, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()


def job_state(model, opt, sched, step):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optimizer": osd, "lr_scheduler": sched.state_dict(),
            "train_state": {"step": step, "tokens": torch.tensor([step * 64, 7])}}


def full_params(model):
    return {n: p.full_tensor().clone() for n, p in model.named_parameters()}


def train_and_save_worker(rank, world, port, src, out):
    model, opt, sched = fsdp2_job(world)
    for step in range(SAVE_AT):
        train_step(model, opt, sched, step, rank)
    dcp.save(job_state(model, opt, sched, SAVE_AT), checkpoint_id=src)
    for step in range(SAVE_AT, STEPS):
        train_step(model, opt, sched, step, rank)
    params = full_params(model)  # a collective: every rank gathers
    if rank == 0:
        torch.save(params, out)


def resume_worker(rank, world, port, ckpt, out):
    from torch.distributed.checkpoint.state_dict import set_state_dict
    model, opt, sched = fsdp2_job(world)
    state = job_state(model, opt, sched, 0)
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    sched.load_state_dict(state["lr_scheduler"])
    assert state["train_state"]["step"] == SAVE_AT
    assert state["train_state"]["tokens"].tolist() == [SAVE_AT * 64, 7]
    assert [g["initial_lr"] for g in opt.param_groups] == [1e-2, 3e-3]
    for step in range(state["train_state"]["step"], STEPS):
        train_step(model, opt, sched, step, rank)
    got = full_params(model)  # a collective: every rank gathers
    if rank == 0:
        expected = torch.load(out)
        assert got.keys() == expected.keys()
        different = [n for n in got if not torch.equal(got[n], expected[n])]
        assert not different, different


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A 2-rank FSDP2 job's DCP checkpoint at step 3, and its parameters after step 5."""
    root = tmp_path_factory.mktemp("fsdp2-job")
    src, out = str(root / "step-3"), str(root / "final.pt")
    tp.spawn(train_and_save_worker, 2, src, out)
    model = Net()
    desc = fmt.describe(model, units=["layers.0", "layers.1"], mesh={"dp": 4},
                        optimizer=optimizer_for(model))
    plan4, _ = tp.compile_model(desc, str(root / "dp4"))
    plan1, _ = tp.compile_model(desc, str(root / "dp1"), mesh="dp=1")
    return {"src": src, "out": out, "plan4": plan4, "plan1": plan1, "root": root}


def keys_of(directory):
    return set(dcp.FileSystemReader(directory).read_metadata().state_dict_metadata)


def test_fsdp2_job_resumes_from_its_resharded_checkpoint(job):
    dst = str(job["root"] / "resharded-4")
    r = tp.mpirun(4, tp.tool("fsdp-ckpt"), "reshard", "--plan", job["plan4"], "--from",
                  job["src"], "--to", dst)
    assert r.returncode == 0, r.stdout + r.stderr
    source, resharded = keys_of(job["src"]), keys_of(dst)
    assert source <= resharded, sorted(source - resharded)
    for key in ("optimizer.param_groups.1.lr", "optimizer.param_groups.1.initial_lr",
                "lr_scheduler.last_epoch", "train_state.step", "train_state.tokens"):
        assert key in resharded, key
    assert "carried" in r.stdout
    assert fm.verify(dst)
    tp.spawn(resume_worker, 2, dst, job["out"])


def test_python_reshard_drops_what_it_is_told(job):
    ck = fm.Checkpointer(job["plan1"])
    ck.allocate()
    dst = job["root"] / "resharded-1"
    result = ck.reshard(job["src"], dst, drop=["train_state"])
    assert "lr_scheduler.last_epoch" in result["carried"]
    assert sorted(result["dropped"]) == ["train_state.step", "train_state.tokens"]
    resharded = keys_of(str(dst))
    assert not [k for k in resharded if k.startswith("train_state")]
    assert keys_of(job["src"]) - resharded == {"train_state.step", "train_state.tokens"}
    with pytest.raises(ValueError, match="reshard: drop takes non-empty key prefixes"):
        ck.reshard(job["src"], job["root"] / "never", drop=[""])
    # What was dropped is gone for torch's own load too; what was carried loads.
    carried = {"lr_scheduler": {"last_epoch": 0}}
    dcp.load(carried, checkpoint_id=str(dst))
    assert carried["lr_scheduler"]["last_epoch"] == SAVE_AT
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: "
                                                  "train_state.step"):
        dcp.load({"train_state": {"step": 0}}, checkpoint_id=str(dst))
    assert not os.path.exists(job["root"] / "never")
