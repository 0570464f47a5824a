"""Resume parity, as a Megatron-FSDP user's job runs: megatron-fsdp 0.6.1 from PyPI (its
experimental fully_shard) on CPU with gloo, trained, saved with fm.torch.save_checkpoint on a
model that was never attached (the drop-in path), loaded into fresh processes, trained on, and
compared bit for bit with the run that never stopped: every parameter's main weight, compute
weight, moment and step, the learning rate, the scheduler's state and the RNG. Across world
sizes (4 -> 2, 2 -> 4) the loaded state is compared with the saved state as whole tensors.

A test double of Megatron-FSDP main (a weak reference to the parameter group, model_weight
replaced at every step) is resumed the same way. Skipped, never passed, where the wheel is not
installed."""

import importlib
import os

import pytest

torch = pytest.importorskip("torch")
fm = pytest.importorskip("fsdp_mlir")
dist = pytest.importorskip("torch.distributed")
try:
    importlib.import_module("megatron_fsdp.experimental")
except Exception as e:  # not installed here
    pytest.skip(f"megatron-fsdp (experimental) is not importable here: {e}",
                allow_module_level=True)

import megatron_cpu as mc  # noqa: E402
import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402
import megatron_main_double as main_double  # noqa: E402

STEPS_BEFORE = 2


@pytest.fixture(autouse=True)
def plan_cache(tmp_path_factory, monkeypatch):
    """The drop-in path's compiled plans, cached for this session only (the workers inherit
    the environment)."""
    monkeypatch.setenv("FSDP_MLIR_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))


def _job(world, rank, kw):
    """The user's job: a fresh model fully_shard-ed by Megatron-FSDP, AdamW (or amsgrad, or SGD
    with momentum) with two param groups (no weight decay for norms), a chainable LR
    scheduler."""
    mc.install()
    model, opt = mc.build(world, hsdp=kw.get("hsdp", False), two_groups=True,
                          optimizer=kw.get("optimizer", "adamw"),
                          amsgrad=kw.get("amsgrad", False))
    if kw.get("main_style"):
        main_double.install()  # for this worker process's lifetime
        main_double.make_main_style(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    return model, opt, sched


def _dump(path, model, opt, sched, losses):
    att = fmt.attached(model)
    snap = mc.snapshot(model, opt)
    snap["scheduler"] = sched.state_dict()
    snap["losses"] = losses
    snap["rng"] = torch.get_rng_state()
    snap["pieces"] = pieces(model, opt, att) if att is not None else None
    torch.save(snap, path)


def pieces(model, opt, att):
    """{fqn: (row_offset, main weight rows, rows of each state tensor by name)} of this rank."""
    out = {}
    for g in att.groups:
        for m in g.members:
            if not m.rows:
                continue
            p = att.params[m.fqn]
            local = p._local_tensor if hasattr(p, "_local_tensor") else p
            st = opt.state.get(p, {})
            moments = tuple(
                (st[r]._local_tensor if hasattr(st[r], "_local_tensor") else st[r]).detach().clone()
                for r in sorted(st) if r != "step")
            out[m.fqn] = (m.row_offset, local.detach().clone()) + moments
    return out


def run_worker(rank, world, port, out, kw, steps):
    """The run that never stops: `steps` steps."""
    model, opt, sched = _job(world, rank, kw)
    losses = [mc.train_step(model, opt, i, world, rank, scheduler=sched) for i in range(steps)]
    _dump(f"{out}.{rank}", model, opt, sched, losses)


def save_worker(rank, world, port, ckdir, out, kw):
    model, opt, sched = _job(world, rank, kw)
    if kw.get("attach_first"):
        # The drop-in save before the first step: it describes, compiles, attaches and creates
        # the optimizer state, and must change nothing of what follows.
        fmt.save_checkpoint(model, opt, ckdir + "-initial")
    losses = [mc.train_step(model, opt, i, world, rank, scheduler=sched)
              for i in range(STEPS_BEFORE)]
    torch.manual_seed(1000 + rank)  # RNG state the resumed run must get back
    fmt.save_checkpoint(model, opt, ckdir,
                        extra={"lr_scheduler": sched, "rng": fmt.RNGState(),
                               "train_state": {"step": STEPS_BEFORE},
                               "losses": fmt.PerRank({"losses": losses})})
    _dump(f"{out}.{rank}", model, opt, sched, losses)


def resume_worker(rank, world, port, ckdir, out, kw, more):
    model, opt, sched = _job(world, rank, kw)
    train_state, mine = {"step": 0}, {"losses": []}
    report = fmt.load_checkpoint(model, opt, ckdir,
                                 extra={"lr_scheduler": sched, "rng": fmt.RNGState(),
                                        "train_state": train_state,
                                        "losses": fmt.PerRank(mine)},
                                 strict=world == kw.get("saved_world", world))
    if world == kw.get("saved_world", world):
        assert report == {}, report
    else:  # the ranks the saving job did not have find no RNG or losses of their own
        assert all(k.startswith(("rng.", "losses.")) for k in report.get("left", [])), report
    assert train_state["step"] == STEPS_BEFORE
    if world == kw.get("saved_world", world):
        want = torch.get_rng_state()
        torch.manual_seed(1000 + rank)
        assert torch.equal(want, torch.get_rng_state()), "RNG state not restored"
        torch.set_rng_state(want)
    loaded = pieces(model, opt, fmt.attached(model))
    losses = list(mine["losses"])
    losses += [mc.train_step(model, opt, STEPS_BEFORE + i, world, rank, scheduler=sched)
               for i in range(more)]
    _dump(f"{out}.{rank}", model, opt, sched, losses)
    torch.save(loaded, f"{out}.loaded.{rank}")


def _load_all(out, world):
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]


def _assert_same(a, b, what):
    """Two snapshots of one rank, bit for bit (every tensor's bytes, every value)."""
    diff = mc.differences(a, b)
    assert not diff, f"{what}: {len(diff)} entries differ, e.g. {diff[:5]}"


def _whole(pieces_by_rank):
    """{fqn: [whole tensors]} assembled from every rank's pieces (replicas must agree)."""
    rows = {}
    for pieces_ in pieces_by_rank:
        for fqn, (ro, *tensors) in pieces_.items():
            rows.setdefault(fqn, {})
            for i, t in enumerate(tensors):
                for r in range(t.shape[0]):
                    key = (i, ro + r)
                    if key in rows[fqn]:
                        assert torch.equal(rows[fqn][key], t[r]), (fqn, key)
                    rows[fqn][key] = t[r]
    return rows


@pytest.mark.parametrize("kw", [
    pytest.param(dict(world=2), id="fsdp2"),
    pytest.param(dict(world=4, hsdp=True), id="hsdp2x2"),
    pytest.param(dict(world=2, main_style=True), id="main-style-double"),
    pytest.param(dict(world=2, amsgrad=True), id="fsdp2-amsgrad"),
    pytest.param(dict(world=2, optimizer="sgd"), id="fsdp2-sgd-momentum"),
    pytest.param(dict(world=4, hsdp=True, optimizer="sgd"), id="hsdp2x2-sgd-momentum"),
])
def test_resume_is_bit_identical(tmp_path, kw):
    world = kw["world"]
    more = 2
    never = str(tmp_path / "never")
    tp.spawn(run_worker, world, never, kw, STEPS_BEFORE + more)
    ck, saved, resumed = str(tmp_path / "ck"), str(tmp_path / "saved"), str(tmp_path / "resumed")
    tp.spawn(save_worker, world, ck, saved, kw)
    fm.verify(ck)
    # The checkpoint holds the optimizer's own state tensors, named as torch names them.
    states = {k["key"].rpartition(".")[2] for k in fm.inspect(ck)["keys"]
              if k["key"].startswith("optimizer.state.")}
    assert states == {"sgd": {"momentum_buffer"}}.get(
        kw.get("optimizer"), {"exp_avg", "exp_avg_sq", "step"} | (
            {"max_exp_avg_sq"} if kw.get("amsgrad") else set())), states
    snap = _load_all(saved, world)[0]
    assert {k.rpartition("/")[2] for k in snap if k.startswith("state/")} == states
    tp.spawn(resume_worker, world, ck, resumed, kw, more)
    for r, (a, b) in enumerate(zip(_load_all(never, world), _load_all(resumed, world))):
        a.pop("pieces"), b.pop("pieces"), a.pop("rng"), b.pop("rng")
        _assert_same(a, b, f"rank {r}")
    # The live lr went through the checkpoint (StepLR derives the next from group["lr"]).
    lrs = [g["lr"] for g in _load_all(saved, world)[0]["param_groups"]]
    assert lrs and all(abs(lr - 1e-2 * 0.8 ** STEPS_BEFORE) < 1e-12 for lr in lrs), lrs


@pytest.mark.parametrize("kw", [{}, {"optimizer": "sgd"}, {"amsgrad": True}],
                         ids=["adamw", "sgd-momentum", "amsgrad"])
def test_attach_before_training_changes_nothing(tmp_path, kw):
    world = 2
    never, saved = str(tmp_path / "never"), str(tmp_path / "saved")
    tp.spawn(run_worker, world, never, kw, STEPS_BEFORE)
    tp.spawn(save_worker, world, str(tmp_path / "ck"), saved, dict(kw, attach_first=True))
    for r, (a, b) in enumerate(zip(_load_all(never, world), _load_all(saved, world))):
        a.pop("pieces"), b.pop("pieces"), a.pop("rng"), b.pop("rng")
        _assert_same(a, b, f"rank {r}")


@pytest.mark.parametrize("saved_world,load_world,optimizer",
                         [(4, 2, "adamw"), (2, 4, "adamw"), (4, 2, "sgd")])
def test_resume_on_another_world_size(tmp_path, saved_world, load_world, optimizer):
    ck, saved, resumed = str(tmp_path / "ck"), str(tmp_path / "saved"), str(tmp_path / "resumed")
    tp.spawn(save_worker, saved_world, ck, saved, {"optimizer": optimizer})
    kw = {"saved_world": saved_world, "optimizer": optimizer}
    tp.spawn(resume_worker, load_world, ck, resumed, kw, 1)
    before = _whole([s["pieces"] for s in _load_all(saved, saved_world)])
    after = _whole([torch.load(f"{resumed}.loaded.{r}", weights_only=False)
                    for r in range(load_world)])
    assert before.keys() == after.keys() and before
    for fqn in before:
        assert before[fqn].keys() == after[fqn].keys(), fqn
        for key, t in before[fqn].items():
            assert torch.equal(t, after[fqn][key]), (fqn, key)
    s = _load_all(saved, saved_world)[0]["scheduler"]
    for r in _load_all(resumed, load_world):
        assert r["scheduler"]["last_epoch"] == s["last_epoch"] + 1


def test_dcp_load_reads_the_live_state(tmp_path):
    """torch.distributed.checkpoint.load of get_state_dict-style state dicts (two param groups
    with the LR scheduler's initial_lr, the scheduler's own state, a train state) reads our
    checkpoint: every key is there, with the values live at save time, not the description's."""
    import torch.distributed.checkpoint as dcp
    ck, saved = str(tmp_path / "ck"), str(tmp_path / "saved")
    tp.spawn(save_worker, 2, ck, saved, {})
    keys = [k["key"] for k in fm.inspect(ck)["keys"]]
    steps = [k for k in keys if k.startswith("optimizer.state.") and k.endswith(".step")]
    assert steps
    # What the job's own optimizer and scheduler state dicts look like (any values).
    dummy = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.AdamW([{"params": [dummy[0]]}, {"params": [dummy[1]]}], lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    groups = [dict(g, params=[]) for g in opt.state_dict()["param_groups"]]
    assert all("initial_lr" in g for g in groups)
    sd = {"optimizer": {"state": {k[len("optimizer.state."):-len(".step")]:
                                  {"step": torch.tensor(0.0)} for k in steps},
                        "param_groups": groups},
          "lr_scheduler": sched.state_dict(),
          "train_state": {"step": 0}}
    dcp.load(sd, checkpoint_id=ck, no_dist=True)
    live = _load_all(saved, 2)[0]["param_groups"]
    for mine, theirs in zip(sd["optimizer"]["param_groups"], live):
        assert mine["lr"] == theirs["lr"] == pytest.approx(1e-2 * 0.8 ** STEPS_BEFORE)
        assert mine["initial_lr"] == theirs["initial_lr"] == 1e-2
        assert mine["weight_decay"] == theirs["weight_decay"]
        assert mine["params"] == theirs["param_names"]
    assert [g["weight_decay"] for g in live] == [0.1, 0.0]
    assert sd["lr_scheduler"]["last_epoch"] == STEPS_BEFORE
    assert sd["lr_scheduler"]["_last_lr"] == [g["lr"] for g in live]
    assert sd["train_state"]["step"] == STEPS_BEFORE
    assert all(float(v["step"]) == STEPS_BEFORE for v in sd["optimizer"]["state"].values())


def test_incompatible_param_groups_named(tmp_path):
    """A checkpoint whose param groups hold other parameters than the optimizer's is refused,
    naming the difference; strict=False loads the rest and reports it."""
    ck, saved = str(tmp_path / "ck"), str(tmp_path / "saved")
    tp.spawn(save_worker, 2, ck, saved, {})
    tp.spawn(one_group_worker, 2, ck)


def one_group_worker(rank, world, port, ckdir):
    mc.install()
    model, opt = mc.build(world, two_groups=False)
    with pytest.raises(fm.Incompatible, match="optimizer param groups"):
        fmt.load_checkpoint(model, opt, ckdir)
    report = fmt.load_checkpoint(model, opt, ckdir, strict=False)
    assert any("param groups" in line for line in report["left"]), report


class _Unsaveable:
    def state_dict(self):
        return {"f": lambda: 0}  # torch.save cannot pickle a lambda

    def load_state_dict(self, state):
        pass


def bad_extra_worker(rank, world, port, ckdir):
    mc.install()
    model, opt = mc.build(world)
    extra = {"weird": _Unsaveable()} if rank == 0 else {"weird": {"ok": 1}}
    with pytest.raises(Exception, match="lambda|rank 0"):
        fmt.save_checkpoint(model, opt, ckdir, extra=extra)
    assert not os.path.exists(ckdir)


def test_extra_that_cannot_be_saved_fails_every_rank(tmp_path):
    """State one rank cannot serialise fails the save on every rank (no rank waits in the save
    for it), and nothing is written."""
    tp.spawn(bad_extra_worker, 2, str(tmp_path / "ck"))


def errors_worker(rank, world, port, ckdir):
    """What does not fit is refused with a clear error naming it."""
    mc.install()
    model, opt = mc.build(world, two_groups=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
    # Extra state the checkpoint lacks: Incompatible naming the key (strict).
    with pytest.raises(fm.Incompatible, match="'data.position' is missing"):
        fmt.load_checkpoint(model, opt, ckdir, extra={"lr_scheduler": sched,
                                                      "data": {"position": 3}})
    # A framework buffer that is not the plan's: the model_weight of another dtype.
    group = next(g for g in mc.parameter_groups(model)
                 if g.model_weight is not g.main_weight and g.requires_grad)
    good = group.model_weight.local_buffer
    group.model_weight.local_buffer = good.to(torch.float16)
    with pytest.raises(fmt.LayoutMismatch, match="framework's model_weight buffer"):
        fmt.save_checkpoint(model, opt, ckdir + "-bad")
    group.model_weight.local_buffer = good
    assert not os.path.exists(ckdir + "-bad")


def test_what_does_not_fit_is_named(tmp_path):
    ck, saved = str(tmp_path / "ck"), str(tmp_path / "saved")
    tp.spawn(save_worker, 2, ck, saved, {})
    tp.spawn(errors_worker, 2, ck)


def fsdp2_worker(rank, world, port, ckdir):
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # pragma: no cover - older torch
        from torch.distributed._composable.fsdp import fully_shard
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match="torch FSDP2.*Shard\\(0\\)"):
        fmt.save_checkpoint(model, opt, ckdir)


def test_fsdp2_model_refused_with_the_reason(tmp_path):
    tp.spawn(fsdp2_worker, 2, str(tmp_path / "ck"))


def test_dcp_load_reads_sgd_momentum(tmp_path):
    """An SGD checkpoint as torch.distributed.checkpoint.load of a get_optimizer_state_dict-style
    state dict reads it: whole momentum_buffer tensors equal to the saving ranks' pieces, SGD's
    param-group keys with their live values, and no step (torch's SGD keeps none)."""
    import torch.distributed.checkpoint as dcp
    ck, saved = str(tmp_path / "ck"), str(tmp_path / "saved")
    tp.spawn(save_worker, 2, ck, saved, {"optimizer": "sgd"})
    keys = {k["key"]: k for k in fm.inspect(ck)["keys"]}
    assert not [k for k in keys if k.startswith("optimizer.state.") and k.endswith(".step")]
    fqns = [k[len("optimizer.state."):-len(".momentum_buffer")] for k in keys
            if k.startswith("optimizer.state.")]
    assert fqns and all(k.endswith(".momentum_buffer") for k in keys
                        if k.startswith("optimizer.state."))
    dummy = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": [dummy[0]]}, {"params": [dummy[1]]}], lr=1.0,
                          momentum=0.5)
    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    groups = [dict(g, params=[]) for g in opt.state_dict()["param_groups"]]
    state = {f: {"momentum_buffer": torch.zeros(keys[f"optimizer.state.{f}.momentum_buffer"]
                                                ["shape"])} for f in fqns}
    sd = {"optimizer": {"state": state, "param_groups": groups}}
    dcp.load(sd, checkpoint_id=ck, no_dist=True)
    live = _load_all(saved, 2)[0]["param_groups"]
    for mine, theirs in zip(sd["optimizer"]["param_groups"], live):
        for key in ("lr", "initial_lr", "momentum", "dampening", "nesterov", "weight_decay"):
            assert mine[key] == theirs[key], key
        assert mine["params"] == theirs["param_names"]
    whole = _whole([s["pieces"] for s in _load_all(saved, 2)])
    assert set(fqns) <= set(whole)
    for fqn in fqns:
        rows = whole[fqn]
        got = sd["optimizer"]["state"][fqn]["momentum_buffer"]
        momentum_rows = {r: t for (i, r), t in rows.items() if i == 1}  # (main, momentum)
        assert len(momentum_rows) == got.shape[0], fqn
        for r, t in momentum_rows.items():
            assert torch.equal(got[r].to(t.dtype), t), (fqn, r)
