"""Mixture-of-experts models (docs/Experts.md) with Megatron-FSDP itself (the PyPI wheel's
`experimental` fully_shard, on CPU with gloo): the experts module is fully_shard-ed on a 1-D
expert-data-parallel sub-mesh, every other unit on the world. Each rank holds its own local
experts; our checkpoint names them globally, PyTorch's dcp.load sees each expert once with the
bytes Megatron-FSDP held, a model with another expert-parallel size loads it with every value
right, and a resume on the same layout continues bit-exactly, attached by hand or through the
drop-in path (which finds the experts' view from Megatron-FSDP's records)."""


import pytest

torch = pytest.importorskip("torch")
import megatron_cpu  # noqa: E402

megatron_cpu.skip_module_unless_importable()
import torch.distributed as dist  # noqa: E402

import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402

EXPERTS = 4
WORLD = 4


class GroupedExperts(torch.nn.Module):
    """Megatron-Core's grouped-GEMM naming: linear_fc1.weight<i>, linear_fc2.weight<i>."""

    def __init__(self, per_rank, first):
        super().__init__()
        self.per_rank = per_rank
        self.linear_fc1 = torch.nn.Module()
        self.linear_fc2 = torch.nn.Module()
        for i in range(per_rank):
            # Global expert first + i has the same weights whatever the EP size.
            g = torch.Generator().manual_seed(1000 + first + i)
            self.linear_fc1.register_parameter(
                f"weight{i}", torch.nn.Parameter(torch.randn(7, 6, generator=g)))
            self.linear_fc2.register_parameter(
                f"weight{i}", torch.nn.Parameter(torch.randn(5, 7, generator=g)))

    def forward(self, x):
        out = 0
        for i in range(self.per_rank):
            h = torch.tanh(x @ getattr(self.linear_fc1, f"weight{i}").t())
            out = out + (h @ getattr(self.linear_fc2, f"weight{i}").t()).square().mean()
        return out


class ToyMoE(torch.nn.Module):
    def __init__(self, per_rank, first):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Parameter(torch.randn(11, 6, generator=g))
        self.mlp = torch.nn.Module()
        self.mlp.router = torch.nn.Parameter(torch.randn(EXPERTS, 6, generator=g))
        self.mlp.experts = GroupedExperts(per_rank, first)

    def forward(self, x):
        h = torch.tanh(x @ self.embed[:6].t())
        return (h @ self.mlp.router.t()).square().mean() + self.mlp.experts(h)


def expert_view(ep):
    return [("edp", WORLD // ep), ("ep", ep)]


def build(rank, ep):
    """This rank's Megatron-FSDP MoE: EP coordinate rank % ep (Megatron-Core's order)."""
    megatron_cpu.install()
    from megatron_fsdp import MixedPrecisionPolicy
    from megatron_fsdp.experimental import fully_shard, fully_shard_optimizer
    from megatron_fsdp.experimental.placement import Flat, Placements
    from torch.distributed.device_mesh import init_device_mesh
    per_rank = EXPERTS // ep
    model = ToyMoE(per_rank, (rank % ep) * per_rank)
    world = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    view = init_device_mesh("cpu", (WORLD // ep, ep), mesh_dim_names=("edp", "ep"))
    policy = MixedPrecisionPolicy(main_params_dtype=torch.float32,
                                  main_grads_dtype=torch.float32)

    def flat(axis):
        return Placements(dp_axes=[axis], parameter=[Flat()], gradient=[Flat()],
                          optimizer=[Flat()])
    fully_shard(model.mlp.experts, view["edp"], flat("edp"), policy)
    fully_shard(model, world, flat("dp"), policy)
    opt = torch.optim.AdamW(list(model.parameters()), lr=1e-2)
    fully_shard_optimizer(opt)
    return model, opt


def train(model, opt, rank, steps, first=0):
    for step in range(first, first + steps):
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(100 * step + rank))
        model(x).backward()
        opt.step()
        opt.zero_grad()


def pieces(model, layout, rank):
    """{checkpoint key: (first row, this rank's main-weight rows)} of every piece it holds."""
    out = {}
    for g in layout["groups"]:
        coord = g["experts"]["expert_coords"][rank] if "experts" in g else None
        for p in g["params"]:
            for c in p["chunks"]:
                if c["rank"] != rank or not c["rows"]:
                    continue
                key = p["global_fqns"][coord] if coord is not None else p["fqn"]
                local = model.get_parameter(p["fqn"])._local_tensor
                out["model." + key] = (c["row_offset"], local.detach().clone().reshape(
                    [c["rows"]] + p["shape"][1:]))
    return out


def snapshot(model, opt):
    """Every parameter's local main weight and its optimizer state, as this rank holds them."""
    def local(t):
        t = t._local_tensor if hasattr(t, "_local_tensor") else t
        return t.detach().clone() if torch.is_tensor(t) else torch.tensor(float(t))
    out = {}
    for name, p in model.named_parameters():
        out[name] = local(p)
        for role, t in opt.state.get(p, {}).items():
            out[f"state.{name}.{role}"] = local(t)
    return out


def attach_unless_drop_in(model, opt, plan):
    """plan None: the drop-in path, which describes the model from Megatron-FSDP's records."""
    if plan is not None:
        fmt.attach(model, opt, plan, comm=dist.group.WORLD)


def save_worker(rank, world, port, plan, layout, ck, out):
    model, opt = build(rank, 2)
    attach_unless_drop_in(model, opt, plan)
    train(model, opt, rank, 2)
    fmt.save_checkpoint(model, opt, ck)
    torch.save(pieces(model, layout, rank), f"{out}.pieces{rank}")
    train(model, opt, rank, 1, first=2)
    torch.save(snapshot(model, opt), f"{out}.never-stopped{rank}")


def resume_worker(rank, world, port, plan, ck, out):
    model, opt = build(rank, 2)
    attach_unless_drop_in(model, opt, plan)
    fmt.load_checkpoint(model, opt, ck)
    train(model, opt, rank, 1, first=2)
    torch.save(snapshot(model, opt), f"{out}.resumed{rank}")


def other_ep_worker(rank, world, port, ep, plan, layout, ck, out):
    model, opt = build(rank, ep)
    attach_unless_drop_in(model, opt, plan)
    fmt.load_checkpoint(model, opt, ck)
    torch.save(pieces(model, layout, rank), f"{out}.ep{ep}-pieces{rank}")


def describe_for(ep):
    model = ToyMoE(EXPERTS // ep, 0)
    opt = torch.optim.AdamW(list(model.parameters()), lr=1e-2)
    return fmt.describe(model, mesh={"dp": WORLD}, optimizer=opt,
                        experts={"mesh": expert_view(ep)})


def test_describe_finds_the_experts():
    d = describe_for(2)
    assert d["expert_meshes"] == [{"name": "experts", "axes": [
        {"name": "edp", "size": 2}, {"name": "ep", "size": 2}], "experts": "ep"}]
    mlp = d["module"]["children"][0]
    experts = mlp["children"][0]
    assert experts["name"] == "experts"
    assert experts["experts"] == {"mesh": "experts", "count": 4, "naming": "grouped"}
    assert experts["fully_shard"]["placements"] == ["shard"]
    with pytest.raises(ValueError, match="expert_axis 'x' is not an axis"):
        fmt.describe(ToyMoE(2, 0), mesh={"dp": 4},
                     experts={"mesh": expert_view(2), "expert_axis": "x"})
    with pytest.raises(ValueError, match="needs a data-parallel axis besides"):
        fmt.describe(ToyMoE(2, 0), mesh={"dp": 4}, experts={"mesh": [("ep", 4)]})
    with pytest.raises(ValueError, match="unknown experts keys \\['size'\\]"):
        fmt.describe(ToyMoE(2, 0), mesh={"dp": 4}, experts={"mesh": expert_view(2), "size": 1})
    with pytest.raises(ValueError, match="experts unit 'nope' is not a submodule"):
        fmt.describe(ToyMoE(2, 0), mesh={"dp": 4},
                     experts={"mesh": expert_view(2), "units": ["nope"]})
    local = ToyMoE(2, 0)
    explicit = fmt.describe(local, mesh={"dp": 4},
                            experts={"mesh": expert_view(2), "units": [local.mlp.experts],
                                     "count": 8})
    assert explicit["module"]["children"][0]["children"][0]["experts"]["count"] == 8
    with pytest.raises(ValueError, match="no module is named 'experts'"):
        fmt.describe(torch.nn.Linear(2, 2), mesh={"dp": 4}, experts={"mesh": expert_view(2)})


@pytest.mark.parametrize("drop_in", [False, True], ids=["attached", "drop-in"])
def test_megatron_fsdp_moe_global_keys_reshard_and_resume(tmp_path, monkeypatch, drop_in):
    plan2, layout2 = tp.compile_model(describe_for(2), str(tmp_path / "ep2"))
    others = {ep: tp.compile_model(describe_for(ep), str(tmp_path / f"ep{ep}")) for ep in (1, 4)}
    if drop_in:
        # The drop-in path finds the experts and their view from Megatron-FSDP's records; the
        # layouts compiled above from describe() say where its bytes must be.
        monkeypatch.setenv("FSDP_MLIR_CACHE", str(tmp_path / "cache"))
        plan2 = None
        others = {ep: (None, layout) for ep, (_, layout) in others.items()}
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")
    tp.spawn(save_worker, WORLD, plan2, layout2, ck, out)

    # PyTorch reads our checkpoint into whole tensors: every global expert once, holding the
    # rows each Megatron-FSDP rank held for it.
    import torch.distributed.checkpoint as dcp
    metadata = dcp.FileSystemReader(ck).read_metadata()
    expert_keys = sorted(k for k in metadata.state_dict_metadata
                         if k.startswith("model.mlp.experts."))
    assert expert_keys == sorted(f"model.mlp.experts.linear_fc{n}.weight{g}"
                                 for n in (1, 2) for g in range(EXPERTS))
    whole = {k: torch.zeros(list(v.size)) for k, v in metadata.state_dict_metadata.items()
             if k.startswith("model.")}
    dcp.load(whole, checkpoint_id=ck, no_dist=True)
    seen = set()
    for rank in range(WORLD):
        for key, (row, rows) in torch.load(f"{out}.pieces{rank}").items():
            assert torch.equal(whole[key][row: row + rows.shape[0]], rows), (rank, key)
            seen.add(key)
    assert seen == set(whole)
    # The experts really trained apart: global expert 0 and 2 differ from their start.
    start = GroupedExperts(EXPERTS, 0)
    assert not torch.equal(whole["model.mlp.experts.linear_fc1.weight2"],
                           start.linear_fc1.weight2.detach())

    # Other expert-parallel sizes load it: EP 1 x EDP 4 (every rank holds every expert's rows)
    # and EP 4 x EDP 1 (each rank one whole expert).
    for ep, (plan, layout) in others.items():
        tp.spawn(other_ep_worker, WORLD, ep, plan, layout, ck, out)
        seen = set()
        for rank in range(WORLD):
            for key, (row, rows) in torch.load(f"{out}.ep{ep}-pieces{rank}").items():
                assert torch.equal(whole[key][row: row + rows.shape[0]], rows), (ep, rank, key)
                seen.add(key)
        assert seen == set(whole), ep

    # The same layout resumes bit-exactly: one more step equals the run that never stopped.
    tp.spawn(resume_worker, WORLD, plan2, ck, out)
    for rank in range(WORLD):
        a = torch.load(f"{out}.never-stopped{rank}")
        b = torch.load(f"{out}.resumed{rank}")
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key])), (rank, key)


def described_worker(rank, world, port, out):
    from fsdp_mlir.torch.adapters import find
    model, opt = build(rank, 2)
    options = find(model).describe_options(model, opt)
    torch.save(fmt.describe(model, optimizer=opt, **options), f"{out}.described{rank}")


def test_drop_in_describes_the_experts_as_describe_does(tmp_path):
    out = str(tmp_path / "out")
    tp.spawn(described_worker, WORLD, out)
    local = ToyMoE(EXPERTS // 2, 0)
    expected = fmt.describe(local, mesh={"dp": WORLD}, main_grads_dtype=torch.float32,
                            experts={"mesh": expert_view(2)})
    for rank in range(WORLD):
        got = torch.load(f"{out}.described{rank}")
        assert got["mesh"] == expected["mesh"] == [{"name": "dp", "size": WORLD}]
        assert got["expert_meshes"] == expected["expert_meshes"]
        experts = got["module"]["children"][0]["children"][0]
        assert experts == expected["module"]["children"][0]["children"][0]


def refusing_views_worker(rank, world, port):
    import types

    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    from fsdp_mlir.torch.adapters import megatron_fsdp as mf
    megatron_cpu.install()

    def group(mesh):
        return types.SimpleNamespace(mesh=mesh, parameter_names=["mlp.experts.w0"])
    world_mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp",))
    assert mf._expert_view(group(world_mesh)) is None
    good = init_device_mesh("cpu", (2, 2), mesh_dim_names=("edp", "ep"))
    assert mf._expert_view(group(good["edp"])) == {"mesh": [("edp", 2), ("ep", 2)],
                                                   "expert_axis": "ep"}
    three = init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("x", "edp", "ep"))
    with pytest.raises(ValueError, match="without exactly one axis.*lacks \\['x', 'ep'\\]"):
        mf._expert_view(group(three["edp"]))
    shuffled = DeviceMesh("cpu", torch.tensor([[0, 2], [1, 3]]), mesh_dim_names=("edp", "ep"))
    with pytest.raises(ValueError, match="not numbered row-major"):
        mf._expert_view(group(shuffled["edp"]))

    # Whole models: only the experts sharded; experts on a second world-sized mesh.
    from megatron_fsdp import MixedPrecisionPolicy
    from megatron_fsdp.experimental import fully_shard
    from megatron_fsdp.experimental.placement import Flat, Placements

    def shard(module, mesh, axis):
        fully_shard(module, mesh, Placements(dp_axes=[axis], parameter=[Flat()],
                                             gradient=[Flat()], optimizer=[Flat()]),
                    MixedPrecisionPolicy(main_params_dtype=torch.float32))
    only_experts = ToyMoE(EXPERTS // 2, 0)
    shard(only_experts.mlp.experts, good["edp"], "edp")
    with pytest.raises(ValueError, match="only experts .* are sharded.*fully_shard the model"):
        mf.MegatronFSDP().describe_options(only_experts, None)
    # A model on one slice of a bigger mesh (as HSDP or tensor parallelism of 1 takes it) has
    # no experts: its slice is its mesh.
    sliced = ToyMoE(EXPERTS // 2, 0)
    shard(sliced, init_device_mesh("cpu", (WORLD, 1), mesh_dim_names=("dp", "tp"))["dp"], "dp")
    options = mf.MegatronFSDP().describe_options(sliced, None)
    assert options["mesh"] == [("dp", WORLD)] and "experts" not in options
    two_worlds = ToyMoE(EXPERTS // 2, 0)
    shard(two_worlds.mlp.experts, init_device_mesh("cpu", (WORLD,), mesh_dim_names=("x",)), "x")
    shard(two_worlds, world_mesh, "dp")
    with pytest.raises(ValueError, match="sharded on \\{'x': 4\\}, the model's other parameters "
                                         "on \\{'dp': 4\\}: one mesh for every unit"):
        mf.MegatronFSDP().describe_options(two_worlds, None)


def test_drop_in_refuses_experts_it_cannot_describe():
    import types

    from fsdp_mlir.torch.adapters import megatron_fsdp as mf

    class Flat:
        pass

    class Replicate:
        pass

    def group(name, *placements):
        weight = types.SimpleNamespace(placements=[p() for p in placements])
        return types.SimpleNamespace(parameter_names=[name], main_weight=weight)
    a, b = group("l0.experts.w0", Flat), group("l1.experts.w0", Flat)
    view = {"mesh": [("edp", 2), ("ep", 2)], "expert_axis": "ep"}
    owner = {id(a): "l0.experts", id(b): "l1.experts"}
    world = [("dp", 4)]
    assert mf._experts_option([a, b], {id(a): view, id(b): view}, owner, world) == dict(
        view, units=["l0.experts", "l1.experts"], placements=["shard"])
    other = {"mesh": [("edp", 4), ("ep", 1)], "expert_axis": "ep"}
    with pytest.raises(ValueError, match="different expert views"):
        mf._experts_option([a, b], {id(a): view, id(b): other}, owner, world)
    c = group("l1.experts.w0", Replicate)
    with pytest.raises(ValueError, match="different placements"):
        mf._experts_option([a, c], {id(a): view, id(c): view}, {id(a): "l0.experts"}, world)
    with pytest.raises(ValueError, match="not owned by a submodule"):
        mf._experts_option([a], {id(a): view}, {id(a): ""}, world)
    with pytest.raises(ValueError, match="does not cover the model's mesh"):
        mf._experts_option([a], {id(a): view}, owner, [("dp", 8)])


def test_drop_in_refuses_expert_views_it_cannot_express(tmp_path):
    tp.spawn(refusing_views_worker, WORLD)
