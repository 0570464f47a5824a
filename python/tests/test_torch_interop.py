"""Interop with PyTorch DCP both ways, every value checked against docs/TestValues.md.

(a) A checkpoint our runtime wrote (fsdp-ckpt save --fill) is loaded by
    torch.distributed.checkpoint.load into DTensors whose local chunks are the true uneven
    pieces (the seed's chunk-list / write-item hooks), on 2 gloo processes, and into whole
    tensors in one process.
(b) Checkpoints dcp.save wrote, from such uneven DTensors and from FSDP2 fully_shard on CPU,
    load into our packed layout on another world size (fsdp-ckpt load --check, and
    fsdp_mlir.torch.load_checkpoint).
"""

import math

import pytest

torch = pytest.importorskip("torch")
fm = pytest.importorskip("fsdp_mlir")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint")

import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402

SEED = 4242
HYPER = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def fresh_model(dtype=torch.bfloat16, tied=True):
    torch.manual_seed(0)
    return tp.TinyLlama(dtype=dtype, tied=tied)


def compile_for(tmp_path, model, world, name):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **HYPER)
    d = fmt.describe(model, units=tp.llama_units(model), mesh={"dp": world}, optimizer=opt)
    return tp.compile_model(d, str(tmp_path / name))


def main_dtype(group, role="main_weight"):
    return next(tp.SHORT[b["dtype"]] for b in group["buffers"] if b["role"] == role)


def keys_of(layout):
    """(key, group, param entry, role) of every tensor key the plan's checkpoint holds."""
    for g in layout["groups"]:
        for p in g["params"]:
            for fqn in [p["fqn"]] + list(p.get("tied_fqns", [])):
                yield f"model.{fqn}", g, p, "main_weight"
            if g["requires_grad"] and any(b["role"] == "exp_avg" for b in g["buffers"]):
                yield f"optimizer.state.{p['fqn']}.exp_avg", g, p, "exp_avg"
                yield f"optimizer.state.{p['fqn']}.exp_avg_sq", g, p, "exp_avg_sq"


def value_key(key, p):
    """The key whose test values a tensor key holds (a tied name holds its first FQN's)."""
    return f"model.{p['fqn']}" if key.startswith("model.") else key


def uneven_state(layout, rank, mesh, fill_seed=None):
    """Every key of the plan as a DTensor over this rank's true piece (zeros, or the test
    values of fill_seed), steps as 0-d tensors, and the 12 hyper-parameters."""
    from torch.distributed.tensor import DTensor, Shard
    state = {}
    for key, g, p, role in keys_of(layout):
        ro, rows, lo = tp.piece(p, rank)
        shape = list(p["shape"])
        rs = tp.row_size(shape)
        if not rows:
            ro = tp._empty_row_offset(p, g, rank)
        dtype = main_dtype(g, role)
        if fill_seed is None:
            local = torch.zeros([rows] + shape[1:], dtype=dtype)
        else:
            local = tp.tv(value_key(key, p), ro * rs, rows * rs, fill_seed, dtype).view(
                [rows] + shape[1:])
        dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                shape=torch.Size(shape), stride=torch.empty(shape,
                                                                            device="meta").stride())
        state[key] = fmt.attach_uneven_dtensor_metadata(dt, ro)
    trainable = [p["fqn"] for g in layout["groups"] if g["requires_grad"] for p in g["params"]]
    for fqn in trainable:
        state[f"optimizer.state.{fqn}.step"] = torch.tensor(0.0 if fill_seed is None else 1.0)
    for name, value in hyper_items(trainable_fqns()).items():
        state[f"optimizer.param_groups.0.{name}"] = value if fill_seed is not None else None
    return state


def trainable_fqns():
    """The param group's `params`: trainable FQNs (first of each storage) in
    named_parameters() order, as torch's optimizer state dict lists them."""
    return [n for n, p in fresh_model().named_parameters() if p.requires_grad]


def hyper_items(trainable):
    return {"lr": HYPER["lr"], "betas": HYPER["betas"], "eps": HYPER["eps"],
            "weight_decay": HYPER["weight_decay"], "amsgrad": False, "maximize": False,
            "foreach": None, "capturable": False, "differentiable": False, "fused": None,
            "decoupled_weight_decay": True, "params": list(trainable)}


def check_state(state, layout, rank, seed, whole=False):
    checked = 0
    for key, g, p, role in keys_of(layout):
        t = state[key]
        shape = list(p["shape"])
        rs = tp.row_size(shape)
        if whole:
            ro, rows = 0, shape[0]
            local = t
        else:
            ro, rows, _ = tp.piece(p, rank)
            local = t.to_local()
            assert list(local.shape) == [rows] + shape[1:], key
        if not rows:
            continue
        want = tp.tv(value_key(key, p), ro * rs, rows * rs, seed, local.dtype)
        got = local.flatten()
        if not torch.equal(got, want):
            i = int((got != want).nonzero()[0])
            raise AssertionError(f"rank {rank}: {key} element {ro * rs + i}: torch read "
                                 f"{got[i].item()}, expected {want[i].item()}")
        checked += got.numel()
    trainable = [p["fqn"] for g in layout["groups"] if g["requires_grad"] for p in g["params"]]
    for fqn in trainable:
        assert float(state[f"optimizer.state.{fqn}.step"]) == 1.0
    for name, value in hyper_items(trainable_fqns()).items():
        got = state[f"optimizer.param_groups.0.{name}"]
        assert got == value or (isinstance(value, tuple) and tuple(got) == value), (name, got)
    return checked


# ---------------------------------------------------------------------------------------------
# (a) ours -> torch


def torch_loads_ours_worker(rank, world, port, layout, ckdir):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    state = uneven_state(layout, rank, mesh)
    dcp.load(state, checkpoint_id=ckdir)
    n = check_state(state, layout, rank, SEED)
    total = torch.tensor([n])
    dist.all_reduce(total)
    want = sum(math.prod(p["shape"]) for key, g, p, role in keys_of(layout))
    assert int(total) == want, (int(total), want)


def test_torch_loads_our_checkpoint(tmp_path):
    plan, layout = compile_for(tmp_path, fresh_model(), 2, "dp2")
    ck = str(tmp_path / "ours")
    r = tp.mpirun(2, tp.tool("fsdp-ckpt"), "save", "--plan", plan, "--dir", ck, "--fill",
                  str(SEED))
    assert r.returncode == 0, r.stderr
    # Some tensor really is uneven (not torch.chunk rows) in this checkpoint.
    info = fm.inspect(ck)
    assert any(len(k["chunks"]) == 2 and k["chunks"][0]["sizes"][0] != -(-k["shape"][0] // 2)
               for k in info["keys"] if k["kind"] == "tensor")
    tp.spawn(torch_loads_ours_worker, 2, layout, ck)

    # Whole tensors in one process (no process group).
    state = {}
    for key, g, p, role in keys_of(layout):
        state[key] = torch.zeros(p["shape"], dtype=main_dtype(g, role))
    trainable = [p["fqn"] for g in layout["groups"] if g["requires_grad"] for p in g["params"]]
    for fqn in trainable:
        state[f"optimizer.state.{fqn}.step"] = torch.tensor(0.0)
    for name in hyper_items(trainable):
        state[f"optimizer.param_groups.0.{name}"] = None
    dcp.load(state, checkpoint_id=ck, no_dist=True)
    n = check_state(state, layout, 0, SEED, whole=True)
    assert n == sum(math.prod(p["shape"]) for key, g, p, role in keys_of(layout))


# ---------------------------------------------------------------------------------------------
# (b) torch -> ours


def torch_saves_uneven_worker(rank, world, port, layout, ckdir):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    state = uneven_state(layout, rank, mesh, fill_seed=SEED)
    dcp.save(state, checkpoint_id=ckdir)


def load_into_packed_worker(rank, world, port, plan, layout, ckdir, dtype):
    packed = tp.pack(fresh_model(dtype=dtype, tied=dtype == torch.bfloat16), layout, rank)
    packed.attach(plan, comm=dist.group.WORLD)
    fmt.load_checkpoint(packed.model, packed.optimizer, ckdir)
    tp.check(packed, SEED)
    for st in packed.optimizer.state.values():
        assert float(st["step"]) == 1.0


def test_our_runtime_loads_uneven_dtensor_checkpoint(tmp_path):
    _, layout2 = compile_for(tmp_path, fresh_model(), 2, "dp2")
    plan4, layout4 = compile_for(tmp_path, fresh_model(), 4, "dp4")
    ck = str(tmp_path / "torch")
    tp.spawn(torch_saves_uneven_worker, 2, layout2, ck)
    # The chunks torch wrote are the true uneven pieces.
    md = dcp.FileSystemReader(ck).read_metadata()
    for key, g, p, role in keys_of(layout2):
        got = sorted((tuple(c.offsets)[0], tuple(c.sizes)[0])
                     for c in md.state_dict_metadata[key].chunks)
        assert got == sorted((c["row_offset"], c["rows"]) for c in p["chunks"]), key
    r = tp.mpirun(4, tp.tool("fsdp-ckpt"), "load", "--plan", plan4, "--dir", ck, "--check",
                  str(SEED))
    assert r.returncode == 0, r.stdout + r.stderr
    tp.spawn(load_into_packed_worker, 4, plan4, layout4, ck, torch.bfloat16)


def fsdp2_saves_worker(rank, world, port, layout, ckdir):
    """FSDP2 fully_shard (canonical Shard(0) DTensors) on a CPU mesh; parameters and Adam
    moments set to the test values through their DTensor offsets; dcp.save of get_state_dict."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    model = fresh_model(dtype=torch.float32, tied=False)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **HYPER)
    # One real step with zero gradients and lr 0 creates the state.
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.param_groups[0]["lr"] = 0.0
    opt.step()
    opt.param_groups[0]["lr"] = HYPER["lr"]
    opt.zero_grad()

    def set_values(t, key):
        local = t._local_tensor
        shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh,
                                                              t.placements)
        rs = tp.row_size(list(t.shape))
        with torch.no_grad():
            local.copy_(tp.tv(key, offset[0] * rs, local.numel(), SEED, local.dtype)
                        .view(local.shape))

    for fqn, p in model.named_parameters():
        set_values(p, f"model.{fqn}")
        if p.requires_grad:
            st = opt.state[p]
            set_values(st["exp_avg"], f"optimizer.state.{fqn}.exp_avg")
            set_values(st["exp_avg_sq"], f"optimizer.state.{fqn}.exp_avg_sq")
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=ckdir)


def test_our_runtime_loads_fsdp2_checkpoint(tmp_path):
    model = fresh_model(dtype=torch.float32, tied=False)
    plan4, layout4 = compile_for(tmp_path, model, 4, "dp4")
    ck = str(tmp_path / "fsdp2")
    tp.spawn(fsdp2_saves_worker, 2, layout4, ck)
    md = dcp.FileSystemReader(ck).read_metadata()
    assert "optimizer.state.model.layers.0.mlp.up_proj.weight.exp_avg" in md.state_dict_metadata
    r = tp.mpirun(4, tp.tool("fsdp-ckpt"), "load", "--plan", plan4, "--dir", ck, "--check",
                  str(SEED))
    assert r.returncode == 0, r.stdout + r.stderr
    tp.spawn(load_into_packed_worker, 4, plan4, layout4, ck, torch.float32)
