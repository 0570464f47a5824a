"""fsdp_mlir.torch.describe: an nn.Module to fsdp-model-v1, checked by compiling it."""

import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

import fsdp_mlir as fm  # noqa: E402
import torch_packing as tp  # noqa: E402
from fsdp_mlir.torch import describe  # noqa: E402


def llama_and_opt(**kw):
    torch.manual_seed(0)
    model = tp.TinyLlama(**kw)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4,
                            betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
    return model, opt


def find(node, path):
    for name in path:
        node = next(c for c in node["children"] if c["name"] == name)
    return node


def test_describe_llama_schema():
    model, opt = llama_and_opt()
    d = describe(model, units=tp.llama_units(model), mesh={"dp": 4}, placements=["shard"],
                 optimizer=opt, main_params_dtype="float32", main_grads_dtype="bfloat16")
    assert d["format"] == "fsdp-model-v1"
    assert d["mesh"] == [{"name": "dp", "size": 4}]
    assert d["optimizer"] == {"kind": "adamw", "lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6,
                              "weight_decay": 0.1, "amsgrad": False, "state_dtype": "f32",
                              "state": ["exp_avg", "exp_avg_sq"]}
    root = d["module"]
    assert root["name"] == ""
    assert root["fully_shard"] == {"placements": ["shard"], "main_params_dtype": "f32",
                                   "main_grads_dtype": "bf16"}
    layer0 = find(root, ["model", "layers", "0"])
    assert layer0["fully_shard"]["placements"] == ["shard"]
    assert "fully_shard" not in find(root, ["model"])
    assert find(root, ["lm_head"])["params"] == [
        {"name": "weight", "shape": [96, 24], "dtype": "bf16",
         "tied_to": "model.embed_tokens.weight"}]
    assert find(root, ["model", "embed_tokens"])["params"] == [
        {"name": "weight", "shape": [96, 24], "dtype": "bf16"}]
    assert find(root, ["model", "rotary_emb"])["params"] == [
        {"name": "inv_freq", "shape": [6], "dtype": "f32", "requires_grad": False}]
    pos = find(root, ["model"])["params"]
    assert pos == [{"name": "pos_scale", "shape": [3, 6], "dtype": "bf16",
                    "requires_grad": False}]
    assert find(root, ["model", "layers", "1", "mlp", "down_proj"])["params"][0]["shape"] == [24, 40]
    json.dumps(d)  # plain JSON


def test_describe_compiles_and_lays_out(tmp_path):
    """The description compiles; the layout has the groups the grouping rules give, in
    named_parameters() order, the tie listed once, frozen groups apart, pieces tiling."""
    model, opt = llama_and_opt()
    d = describe(model, units=tp.llama_units(model), mesh={"dp": 4}, optimizer=opt,
                 main_grads_dtype="bf16")
    plan, layout = tp.compile_model(d, str(tmp_path / "out"))
    assert os.path.getsize(plan) > 0
    groups = layout["groups"]
    # In named_parameters() order the root unit meets model.pos_scale (frozen bf16, Inner's own
    # parameter) first, then model.embed_tokens.weight (trainable bf16), then the f32 inv_freq.
    assert [(g["unit"], g["dtype"], g["requires_grad"]) for g in groups] == [
        ("", "bf16", False), ("", "bf16", True), ("", "f32", False),
        ("model.layers.0", "bf16", True), ("model.layers.1", "bf16", True)]
    assert [p["fqn"] for p in groups[1]["params"]] == ["model.embed_tokens.weight",
                                                       "model.norm.weight"]
    assert groups[1]["params"][0]["tied_fqns"] == ["lm_head.weight"]
    assert [p["fqn"] for p in groups[2]["params"]] == ["model.rotary_emb.inv_freq"]
    assert [p["fqn"] for p in groups[0]["params"]] == ["model.pos_scale"]
    expect = [n for n, _ in model.model.layers[0].named_parameters()]
    assert [p["fqn"] for p in groups[3]["params"]] == [f"model.layers.0.{n}" for n in expect]
    roles = [b["role"] for b in groups[1]["buffers"]]
    assert roles == ["main_weight", "model_weight", "main_grad", "exp_avg", "exp_avg_sq"]
    assert [b["dtype"] for b in groups[1]["buffers"]] == ["f32", "bf16", "bf16", "f32", "f32"]
    assert [b["role"] for b in groups[0]["buffers"]] == ["main_weight", "model_weight"]
    assert [b["role"] for b in groups[2]["buffers"]] == ["main_weight", "model_weight"]
    assert groups[2]["buffers"][1].get("aliases") == "main_weight"
    named = dict(model.named_parameters())
    for g in groups:
        for p in g["params"]:
            assert p["shape"] == list(named[p["fqn"]].shape)
            rows = sorted((c["row_offset"], c["rows"]) for c in p["chunks"])
            covered = 0
            for ro, n in rows:
                assert ro == covered
                covered += n
            assert covered == p["shape"][0]
    # Somewhere the packing is uneven: a tensor split unlike torch.chunk.
    uneven = False
    for g in groups:
        for p in g["params"]:
            if len(p["chunks"]) > 1:
                canon = -(-p["shape"][0] // 4)
                uneven |= any(c["rows"] != canon for c in p["chunks"][:-1])
    assert uneven


def test_describe_keys_match_torch_names(tmp_path):
    """A checkpoint of the compiled plan has one model.<fqn> key per name torch gives (tied
    names included) and optimizer state under the first FQN of every trainable storage."""
    model, opt = llama_and_opt()
    d = describe(model, units=tp.llama_units(model), mesh={"dp": 1}, optimizer=opt)
    plan, layout = tp.compile_model(d, str(tmp_path / "out"))
    ck = str(tmp_path / "ck")
    r = subprocess.run([tp.tool("fsdp-ckpt"), "save", "--plan", plan, "--dir", ck, "--fill", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([tp.tool("fsdp-ckpt"), "inspect", ck, "--json"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    keys = {k["key"] for k in json.loads(r.stdout)["keys"]}
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert {k for k in keys if k.startswith("model.")} == {f"model.{n}" for n in names}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert {k for k in keys if k.startswith("optimizer.state.")} == {
        f"optimizer.state.{n}.{s}" for n in trainable for s in ("exp_avg", "exp_avg_sq", "step")}


def test_describe_units_as_modules_and_hsdp(tmp_path):
    model, opt = llama_and_opt()
    by_name = describe(model, units=tp.llama_units(model), mesh={"r": 2, "s": 2},
                       placements="replicate,shard", optimizer=opt)
    by_module = describe(model, units=list(model.model.layers), mesh=[("r", 2), ("s", 2)],
                         placements=["replicate", "shard"], optimizer=opt)
    assert by_name == by_module
    _, layout = tp.compile_model(by_name, str(tmp_path / "out"))
    assert layout["mesh"] == [{"name": "r", "size": 2}, {"name": "s", "size": 2}]
    g = layout["groups"][0]
    assert [r["begin"] for r in g["ranks"]] == [0, g["shard_size"], 0, g["shard_size"]]


def test_describe_adam_defaults_and_no_optimizer():
    model, _ = llama_and_opt()
    opt = torch.optim.Adam(model.parameters())
    d = describe(model, mesh={"dp": 2}, optimizer=opt)
    assert d["optimizer"] == {"kind": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                              "weight_decay": 0.0, "amsgrad": False, "state_dtype": "f32",
                              "state": ["exp_avg", "exp_avg_sq"]}
    d = describe(model, mesh=None)
    assert "optimizer" not in d and "mesh" not in d
    assert "main_grads_dtype" not in d["module"]["fully_shard"]


def test_describe_meta_device_ties_by_identity(tmp_path):
    """A model built on the meta device (no memory): ties come from parameter identity only
    (every meta tensor has data pointer 0)."""
    with torch.device("meta"):
        model = tp.TinyLlama(vocab=512, hidden=64, kv=32, inter=128, layers=3)
    d = describe(model, units=tp.llama_units(model), mesh={"dp": 8})
    assert find(d["module"], ["lm_head"])["params"][0]["tied_to"] == "model.embed_tokens.weight"
    q = find(d["module"], ["model", "layers", "0", "self_attn", "q_proj"])["params"][0]
    assert "tied_to" not in q
    _, layout = tp.compile_model(d, str(tmp_path / "out"))
    assert len(layout["groups"]) == 6


def test_describe_untied_and_storage_ties():
    model, _ = llama_and_opt(tied=False)
    d = describe(model, mesh={"dp": 2})
    assert "tied_to" not in find(d["module"], ["lm_head"])["params"][0]
    # Two distinct Parameter objects over the same memory are one storage too.
    m = torch.nn.Module()
    m.a = torch.nn.Linear(4, 4, bias=False)
    m.b = torch.nn.Linear(4, 4, bias=False)
    m.b.weight = torch.nn.Parameter(m.a.weight.data)
    d = describe(m, mesh={"dp": 2})
    assert find(d["module"], ["b"])["params"][0]["tied_to"] == "a.weight"


def test_describe_errors():
    model, _ = llama_and_opt()
    with pytest.raises(ValueError, match="not a submodule"):
        describe(model, units=["model.layers.9"], mesh={"dp": 2})
    with pytest.raises(ValueError, match="Adagrad is not supported.*Adam.*SGD"):
        describe(model, mesh={"dp": 2}, optimizer=torch.optim.Adagrad(model.parameters()))
    with pytest.raises(ValueError, match="placements"):
        describe(model, mesh={"dp": 2}, placements=["shard", "shard"])
    with pytest.raises(ValueError, match="positive"):
        describe(model, mesh={"dp": 0})
    m = torch.nn.Module()
    m.scale = torch.nn.Parameter(torch.tensor(1.0))
    with pytest.raises(ValueError, match="'scale' is 0-d"):
        describe(m, mesh={"dp": 2})
    m = torch.nn.Module()
    m.c = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="complex64"):
        describe(m, mesh={"dp": 2})
    opt = torch.optim.AdamW([{"params": [model.lm_head.weight], "lr": 0.1},
                             {"params": list(model.model.layers.parameters()), "lr": 0.2}])
    # Param groups may differ: hyper-parameters are live (saved at each save); the description
    # keeps group 0's, what fsdp-ckpt writes.
    assert describe(model, mesh={"dp": 2}, optimizer=opt)["optimizer"]["lr"] == 0.1
    # Groups that would keep different state tensors: refused, naming the hyper-parameter.
    layers = list(model.model.layers.parameters())
    mixed = torch.optim.AdamW([{"params": [model.lm_head.weight], "amsgrad": True},
                               {"params": layers}])
    with pytest.raises(ValueError, match=r"differ in amsgrad \(\[True, False\]\)"):
        describe(model, mesh={"dp": 2}, optimizer=mixed)
    mixed = torch.optim.SGD([{"params": [model.lm_head.weight], "momentum": 0.9},
                             {"params": layers}], lr=0.1)
    with pytest.raises(ValueError, match="differ in momentum"):
        describe(model, mesh={"dp": 2}, optimizer=mixed)


@pytest.mark.parametrize("make,state", [
    (lambda ps: torch.optim.AdamW(ps, amsgrad=True), ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True), ("momentum_buffer",)),
    (lambda ps: torch.optim.SGD(ps, lr=0.1), ()),
], ids=["amsgrad", "sgd-nesterov", "sgd-plain"])
def test_describe_other_optimizers(tmp_path, make, state):
    """amsgrad and SGD: the description names the state tensors the optimizer keeps, the
    compiled layout gives every trainable group a buffer for each, and a checkpoint of the plan
    holds them under torch's names (a step only where torch keeps one)."""
    model, _ = llama_and_opt()
    opt = make(model.parameters())
    d = describe(model, units=tp.llama_units(model), mesh={"dp": 1}, optimizer=opt)
    assert d["optimizer"]["state"] == list(state)
    if isinstance(opt, torch.optim.SGD):
        assert {k: d["optimizer"][k] for k in ("momentum", "dampening", "nesterov")} == {
            "momentum": opt.defaults["momentum"], "dampening": 0.0,
            "nesterov": opt.defaults["nesterov"]}
    plan, layout = tp.compile_model(d, str(tmp_path / "out"))
    for g in layout["groups"]:
        roles = [b["role"] for b in g["buffers"]]
        assert roles[3:] == (list(state) if g["requires_grad"] else []), roles
    ck = str(tmp_path / "ck")
    r = subprocess.run([tp.tool("fsdp-ckpt"), "save", "--plan", plan, "--dir", ck, "--fill", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    keys = {k["key"] for k in fm.inspect(ck)["keys"]}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    steps = () if isinstance(opt, torch.optim.SGD) else ("step",)
    assert {k for k in keys if k.startswith("optimizer.state.")} == {
        f"optimizer.state.{n}.{s}" for n in trainable for s in state + steps}
    # The planned param group has the kind's own keys (torch's order, values from group 0).
    group = opt.state_dict()["param_groups"][0]
    assert [k[len("optimizer.param_groups.0."):] for k in sorted(keys)
            if k.startswith("optimizer.param_groups.0.")] == sorted(group)
