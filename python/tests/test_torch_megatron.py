"""Against Megatron-FSDP itself (the `megatron-fsdp` wheel from PyPI, pure Python, its
`experimental` fully_shard), on CPU with gloo where it runs there: its flat buffers hold the
same bytes where our plan (and tests' packing) puts them, attach accepts its model as it is
(finding its model_weight and main_grad buffers through its parameter groups, moving torch's
separately allocated Adam state into packed buffers), and save/load round-trips through it.
Skipped, never passed, where the wheel is not installed or needs CUDA."""

import os

import pytest

torch = pytest.importorskip("torch")
import megatron_cpu  # noqa: E402

megatron_cpu.skip_module_unless_importable()
import torch.distributed as dist  # noqa: E402

import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402

SEED = 77


def fresh_model():
    torch.manual_seed(0)
    # Untied: Megatron-FSDP 0.6 packs a tied weight once per name (two slots), where the plan
    # (and torch's named_parameters) has one storage.
    return tp.TinyLlama(tied=False)


def megatron_model(world):
    from megatron_fsdp import MixedPrecisionPolicy
    from megatron_fsdp.experimental import fully_shard, fully_shard_optimizer
    from megatron_fsdp.experimental.placement import Flat, Placements
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    placements = Placements(dp_axes=["dp"], parameter=[Flat()], gradient=[Flat()],
                            optimizer=[Flat()])
    policy = MixedPrecisionPolicy(main_params_dtype=torch.float32,
                                  main_grads_dtype=torch.bfloat16)
    model = fresh_model()
    for layer in model.model.layers:
        fully_shard(layer, mesh, placements, policy)
    fully_shard(model, mesh, placements, policy)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    fully_shard_optimizer(opt)
    return model, opt


def worker(rank, world, port, plan, layout, ckdir, phase):
    try:
        model, opt = megatron_model(world)
    except Exception as e:  # e.g. a CUDA-only path in this version
        if rank == 0:
            with open(ckdir + ".skip", "w") as f:
                f.write(f"{type(e).__name__}: {e}")
        return
    ours = tp.pack(fresh_model(), layout, rank)
    groups = {}
    for m in model.modules():
        for g in getattr(m, "parameter_groups", ()) or ():
            groups[g.parameter_names[0]] = g
    # The same bytes where Megatron-FSDP puts them: every piece of every main weight (holes and
    # padding are uninitialised there).
    compared = 0
    for gi, g, p, ro, rows, lo in ours.pieces():
        if not rows:
            continue
        mine = ours.buffers[(gi, "main_weight")]
        sharded = model.get_parameter(p["fqn"])
        local = sharded._local_tensor
        mg = getattr(sharded, "_mfsdp_parameter_group")
        n = rows * tp.row_size(p["shape"])
        assert local.storage_offset() - mg.main_weight.local_buffer.storage_offset() == lo, p["fqn"]
        assert torch.equal(mg.main_weight.local_buffer[lo: lo + n], mine[lo: lo + n]), p["fqn"]
        assert mg.main_weight.local_buffer.numel() == g["shard_size"]
        compared += n
    assert compared > 0
    assert len(opt.state) == 0
    fmt.attach(model, opt, plan, comm=dist.group.WORLD)
    att = fmt.attached(model)
    # torch's AdamW state (primed by attach through Megatron's grad-casting optimizer hooks)
    # now lives in packed buffers of the plan's layout.
    for g in att.groups:
        for m in g.members:
            if g.requires_grad and m.rows:
                st = opt.state[att.params[m.fqn]]
                buf = att.buffers[(g.index, "exp_avg")]
                assert st["exp_avg"]._local_tensor.untyped_storage().data_ptr() == \
                    buf.untyped_storage().data_ptr()
    for g in att.groups:
        mg = getattr(att.params[g.members[0].fqn], "_mfsdp_parameter_group")
        assert att.buffers[(g.index, "main_weight")].data_ptr() == mg.main_weight.local_buffer.data_ptr()
        if (g.index, "model_weight") in att.buffers:
            assert att.buffers[(g.index, "model_weight")].data_ptr() == \
                mg.model_weight.local_buffer.data_ptr()
    ck = att.checkpointer
    if phase == "save":
        ck.fill(SEED)
        fmt.save_checkpoint(model, opt, ckdir)
    else:
        fmt.load_checkpoint(model, opt, ckdir)
        ck.check(SEED)
        # through Megatron's own objects: the sharded parameter and its model weight
        w = model.get_parameter("model.layers.0.mlp.up_proj.weight")
        p = next(q for gr in layout["groups"] for q in gr["params"]
                 if q["fqn"] == "model.layers.0.mlp.up_proj.weight")
        ro, rows, lo = tp.piece(p, rank)
        if rows:
            want = tp.tv("model.model.layers.0.mlp.up_proj.weight", ro * 24, rows * 24, SEED)
            assert torch.equal(w._local_tensor.flatten(), want)
            mg = getattr(w, "_mfsdp_parameter_group")
            assert torch.equal(mg.model_weight.local_buffer[lo: lo + rows * 24],
                               want.to(torch.bfloat16))


def test_megatron_fsdp_same_bytes_and_round_trip(tmp_path):
    model = fresh_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    d = fmt.describe(model, units=tp.llama_units(model), mesh={"dp": 2}, optimizer=opt,
                     main_grads_dtype="bf16")
    plan, layout = tp.compile_model(d, str(tmp_path / "dp2"))
    ck = str(tmp_path / "ck")
    tp.spawn(worker, 2, plan, layout, ck, "save")
    if os.path.exists(ck + ".skip"):
        pytest.skip(f"Megatron-FSDP's fully_shard does not run on CPU here: "
                    f"{open(ck + '.skip').read()}")
    r = tp.mpirun(2, tp.tool("fsdp-ckpt"), "load", "--plan", plan, "--dir", ck, "--check",
                  str(SEED))
    assert r.returncode == 0, r.stdout + r.stderr
    tp.spawn(worker, 2, plan, layout, ck, "load")
