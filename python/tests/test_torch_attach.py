"""fsdp_mlir.torch.attach: the layout check, the optimizer state, the bindings (one process)."""

import json
import math

import pytest

torch = pytest.importorskip("torch")
fm = pytest.importorskip("fsdp_mlir")

import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402


def compiled(tmp_path, world, name="out", **kw):
    torch.manual_seed(0)
    model = tp.TinyLlama(**kw)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    d = fmt.describe(model, units=tp.llama_units(model), mesh={"dp": world}, optimizer=opt,
                     main_grads_dtype="bf16")
    plan, layout = tp.compile_model(d, str(tmp_path / name))
    return plan, layout


def fresh_model(**kw):
    torch.manual_seed(0)
    return tp.TinyLlama(**kw)


def canonical_layout(layout):
    """What a Shard(0) checkpointer assumes: torch.chunk rows per rank, packed one after the
    other in each rank's shard."""
    out = json.loads(json.dumps(layout))
    world = math.prod(a["size"] for a in layout["mesh"])
    for g in out["groups"]:
        used = {r["rank"]: 0 for r in g["ranks"]}
        for p in g["params"]:
            rows, rs = p["shape"][0], tp.row_size(p["shape"])
            per = -(-rows // world)
            p["chunks"] = []
            for r in range(world):
                lo, hi = min(r * per, rows), min((r + 1) * per, rows)
                if hi > lo:
                    p["chunks"].append({"rank": r, "row_offset": lo, "rows": hi - lo,
                                        "local_offset": used[r]})
                    used[r] += (hi - lo) * rs
        g["shard_size"] = max(g["shard_size"], max(used.values()))
    return out


def test_attach_binds_every_buffer_where_the_plan_says(tmp_path):
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0)
    tp.fill(packed, 11)
    ck = packed.attach(plan)
    att = fmt.attached(packed.model)
    assert att is not None and att.checkpointer is ck
    for (g, role), t in packed.buffers.items():
        if role == "model_weight" and t is packed.buffers[(g, "main_weight")]:
            assert (g, role) not in att.buffers  # aliases main_weight: nothing to bind
        elif role in ("main_weight", "exp_avg", "exp_avg_sq", "model_weight"):
            assert att.buffers[(g, role)].data_ptr() == t.data_ptr(), (g, role)
    # The runtime sees the torch-filled bytes as the test values: check() passes, and a
    # runtime fill is visible through the parameters.
    ck.check(11)
    ck.fill(12)
    tp.check(packed, 12)
    emb = packed.model.model.embed_tokens.weight
    assert torch.equal(emb.flatten()[:5], tp.tv("model.model.embed_tokens.weight", 0, 5, 12))
    assert packed.model.lm_head.weight is emb


def test_attach_with_another_world_size_refused(tmp_path):
    plan, layout = compiled(tmp_path, 2)
    packed = tp.pack(fresh_model(), layout, 0)
    with pytest.raises(ValueError, match="2 ranks"):
        packed.attach(plan)


@pytest.mark.parametrize("rank", [0, 1])
def test_attach_refuses_another_layout_naming_the_parameter(tmp_path, rank):
    """A model packed by the naive rule (no conjugates, no hole filling) has the same groups
    and buffer roles but other offsets: refused, naming the first parameter that differs."""
    plan, layout = compiled(tmp_path, 2)
    other = tp.naive_layout(layout)
    want = tp.first_difference(layout, other, rank)
    assert want is not None
    packed = tp.pack(fresh_model(), other, rank)
    with pytest.raises(fmt.LayoutMismatch, match=f"'{want}'") as e:
        packed.attach(plan, rank=rank, world_size=2)
    assert isinstance(e.value, ValueError)
    assert isinstance(e.value, fm.CheckpointError)
    assert fmt.attached(packed.model) is None


@pytest.mark.parametrize("rank", [0, 1])
def test_attach_refuses_canonical_shard0(tmp_path, rank):
    plan, layout = compiled(tmp_path, 2)
    other = canonical_layout(layout)
    want = tp.first_difference(layout, other, rank)
    packed = tp.pack(fresh_model(), other, rank)
    with pytest.raises(fmt.LayoutMismatch, match=f"'{want}'"):
        packed.attach(plan, rank=rank, world_size=2)


def test_attach_refuses_a_moved_parameter(tmp_path):
    """One parameter copied out of its buffer (param.data replaced): named."""
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0)
    w = packed.model.model.layers[1].mlp.up_proj.weight
    w.data = w.data.clone()
    with pytest.raises(fmt.LayoutMismatch, match="'model.layers.1.mlp.up_proj.weight'"):
        packed.attach(plan)


def test_attach_refuses_other_models(tmp_path):
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0)
    packed.model.extra = torch.nn.Linear(2, 2)
    with pytest.raises(fmt.LayoutMismatch, match="'extra.weight' is not in the plan"):
        packed.attach(plan)
    packed = tp.pack(fresh_model(), layout, 0)
    del packed.model.model.norm.weight
    with pytest.raises(fmt.LayoutMismatch, match="'model.norm.weight' is not a parameter"):
        packed.attach(plan)
    packed = tp.pack(fresh_model(), layout, 0)
    packed.model.lm_head.weight = torch.nn.Parameter(packed.model.lm_head.weight.detach().clone())
    with pytest.raises(fmt.LayoutMismatch, match="'lm_head.weight' is tied"):
        packed.attach(plan)


def test_attach_initialises_missing_optimizer_state(tmp_path):
    """No optimizer state yet: attach creates what torch's Adam creates on its first step (step
    0, zero moments) directly in packed buffers, without a step: no weight moves, the step
    count stays 0, and the optimizer keeps working on those views."""
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0, with_state=False, weight_decay=0.5, lr=0.1)
    assert len(packed.optimizer.state) == 0
    before = {k: v.detach().clone() for k, v in packed.model.named_parameters()}
    ck = packed.attach(plan)
    after = dict(packed.model.named_parameters())
    for k, v in before.items():
        assert torch.equal(after[k].detach(), v), k
    assert packed.optimizer.param_groups[0]["lr"] == 0.1
    assert all(p.grad is None for p in packed.model.parameters())
    att = fmt.attached(packed.model)
    for g in att.groups:
        if "exp_avg" not in g.roles:
            continue
        buf = att.buffers[(g.index, "exp_avg")]
        for m in g.members:
            st = packed.optimizer.state[att.params[m.fqn]]
            assert float(st["step"]) == 0.0
            assert st["step"].dtype == torch.float32 and st["step"].device.type == "cpu"
            assert not st["exp_avg"].any() and not st["exp_avg_sq"].any()
            if m.rows:
                assert st["exp_avg"].untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
                assert st["exp_avg"].storage_offset() - buf.storage_offset() == m.local_offset
    ck.fill(5)
    w = packed.model.model.layers[0].self_attn.q_proj.weight
    st = packed.optimizer.state[w]
    assert torch.equal(st["exp_avg"].flatten()[:4],
                       tp.tv("optimizer.state.model.layers.0.self_attn.q_proj.weight.exp_avg",
                             0, 4, 5))
    # A real step updates the packed buffers in place.
    for p in packed.model.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    packed.optimizer.step()
    assert torch.equal(st["exp_avg"].flatten()[:4],
                       att.buffers[(3, "exp_avg")][:4])


def test_attach_init_with_grad_dtype(tmp_path):
    """Parameters marked with grad_dtype (bf16 main grads of f32 main weights), as Megatron-FSDP
    marks them: the state is created without a gradient or a step, so grad_dtype, the gradient
    and the weights stay as they were."""
    if not hasattr(torch.Tensor, "grad_dtype"):
        pytest.skip("this torch has no Tensor.grad_dtype")
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0, with_state=False, set_grad_dtype=True)
    p = packed.model.model.norm.weight
    assert p.grad_dtype == torch.bfloat16
    before = p.detach().clone()
    packed.attach(plan)
    st = packed.optimizer.state[p]
    assert float(st["step"]) == 0.0
    assert p.grad_dtype == torch.bfloat16 and p.grad is None
    assert torch.equal(p.detach(), before)


def test_attach_then_training_is_unchanged(tmp_path):
    """Two steps after attach give bit for bit what two steps without it give: the same
    weights, moments and step counts (no priming step, no lr-0 step)."""
    plan, layout = compiled(tmp_path, 1)

    def train(attach):
        packed = tp.pack(fresh_model(), layout, 0, with_state=False, weight_decay=0.1, lr=0.01)
        if attach:
            packed.attach(plan)
        for step in range(2):
            torch.manual_seed(100 + step)
            for p in packed.model.parameters():
                if p.requires_grad:
                    p.grad = torch.randn_like(p)
            packed.optimizer.step()
        params = {k: v.detach().clone() for k, v in packed.model.named_parameters()}
        state = {packed_name: {n: (t.clone() if isinstance(t, torch.Tensor) else t)
                               for n, t in packed.optimizer.state[p].items()}
                 for packed_name, p in packed.model.named_parameters() if p.requires_grad}
        return params, state

    plain, attached = train(False), train(True)
    for k in plain[0]:
        assert torch.equal(plain[0][k], attached[0][k]), k
    for k in plain[1]:
        for n in plain[1][k]:
            assert torch.equal(plain[1][k][n], attached[1][k][n]), (k, n)
        assert float(attached[1][k]["step"]) == 2.0


def test_attach_refuses_state_in_another_layout(tmp_path):
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0)
    # exp_avg packed in one buffer but shifted by one row of q_proj
    w = packed.model.model.layers[0].self_attn.q_proj.weight
    st = packed.optimizer.state[w]
    base = st["exp_avg"]
    st["exp_avg"] = torch.empty(0).set_(base.untyped_storage(), base.storage_offset() + 24,
                                        base.shape, base.stride())
    with pytest.raises(fmt.LayoutMismatch, match="exp_avg of 'model.layers.0.self_attn.q_proj"):
        packed.attach(plan)


def test_save_load_one_process(tmp_path):
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0)
    tp.fill(packed, 21)
    for st in packed.optimizer.state.values():
        st["step"] = torch.tensor(4.0)
    packed.attach(plan)
    fmt.save_checkpoint(packed.model, packed.optimizer, tmp_path / "ck")
    fm.verify(str(tmp_path / "ck"))
    # Saving again replaces it (the seed's save overwrites); overwrite=False refuses.
    fmt.save_checkpoint(packed.model, packed.optimizer, tmp_path / "ck")
    with pytest.raises(ValueError, match="already exists"):
        fmt.save_checkpoint(packed.model, packed.optimizer, tmp_path / "ck", overwrite=False)

    other = tp.pack(fresh_model(), layout, 0)
    other.optimizer.param_groups[0]["lr"] = 0.5
    other.attach(plan)
    fmt.load_checkpoint(other.model, other.optimizer, tmp_path / "ck")
    assert tp.check(other, 21) > 0
    assert other.optimizer.param_groups[0]["lr"] == 1e-3
    for st in other.optimizer.state.values():
        assert float(st["step"]) == 4.0


def test_unattached_refused(tmp_path):
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0)
    # A model packed by hand records no units or mesh: it cannot be described from itself.
    with pytest.raises(ValueError, match="never attached.*does not record its units"):
        fmt.save_checkpoint(packed.model, packed.optimizer, tmp_path / "ck")
    with pytest.raises(ValueError, match="never attached"):
        fmt.load_checkpoint(packed.model, packed.optimizer, tmp_path / "ck")
    packed.attach(plan)
    other = torch.optim.AdamW(packed.model.parameters())
    with pytest.raises(ValueError, match="not the one"):
        fmt.save_checkpoint(packed.model, other, tmp_path / "ck")


def test_optimizer_load_state_dict_is_followed(tmp_path):
    """optimizer.load_state_dict copies the state into new tensors; save still saves it (the
    state is moved back into the bound buffers)."""
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0)
    packed.attach(plan)
    ck = fmt.attached(packed.model).checkpointer
    ck.fill(8)
    sd = packed.optimizer.state_dict()
    sd = {"state": {k: {n: t.clone() for n, t in v.items()} for k, v in sd["state"].items()},
          "param_groups": sd["param_groups"]}
    ck.fill(9)  # the live buffers move on; the state dict keeps seed 8's moments
    packed.optimizer.load_state_dict(sd)
    fmt.save_checkpoint(packed.model, packed.optimizer, tmp_path / "ck")
    other = tp.pack(fresh_model(), layout, 0)
    other.attach(plan)
    fmt.load_checkpoint(other.model, other.optimizer, tmp_path / "ck")
    # weights of seed 9, moments of seed 8
    tp.check(other, 9, moments=False)
    w = other.model.model.layers[0].mlp.down_proj.weight
    assert torch.equal(other.optimizer.state[w]["exp_avg_sq"].flatten()[:3],
                       tp.tv("optimizer.state.model.layers.0.mlp.down_proj.weight.exp_avg_sq",
                             0, 3, 8))


def test_attach_allocates_what_it_cannot_find(tmp_path):
    """Without buffers=, model_weight is a fresh buffer cast from main_weight and main_grad a
    zeroed one; a load refreshes that model_weight."""
    plan, layout = compiled(tmp_path, 1)
    packed = tp.pack(fresh_model(), layout, 0)
    tp.fill(packed, 2)
    fmt.attach(packed.model, packed.optimizer, plan)
    att = fmt.attached(packed.model)
    g = 1  # the root's trainable bf16 group
    mw = att.buffers[(g, "model_weight")]
    assert mw.data_ptr() != packed.buffers[(g, "model_weight")].data_ptr()
    assert torch.equal(mw, packed.buffers[(g, "main_weight")].to(torch.bfloat16))
    assert not att.buffers[(g, "main_grad")].any()
    fmt.save_checkpoint(packed.model, packed.optimizer, tmp_path / "ck")
    mw.zero_()
    fmt.load_checkpoint(packed.model, packed.optimizer, tmp_path / "ck")
    assert torch.equal(mw, packed.buffers[(g, "main_weight")].to(torch.bfloat16))
