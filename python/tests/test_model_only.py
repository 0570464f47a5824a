"""Model-only saves and partial loads, as a job uses them: a Megatron-FSDP job (0.6.1 from PyPI,
on CPU with gloo) trained two steps saves the model alone (save_checkpoint(model_only=True):
the model.* keys and `extra`, a third of the bytes of the full checkpoint with AdamW) and a
full checkpoint; torch.distributed.checkpoint reads the model-only one; a fresh job loads its
weights into a fresh optimizer (load_checkpoint(exclude=["optimizer"])): every main weight as
saved, the optimizer untouched, training goes on; a full load of it names what is missing.
Skipped where megatron-fsdp is not installed."""

import importlib
import os

import pytest

torch = pytest.importorskip("torch")
fm = pytest.importorskip("fsdp_mlir")
try:
    importlib.import_module("megatron_fsdp.experimental")
except Exception as e:  # not installed here
    pytest.skip(f"megatron-fsdp (experimental) is not importable here: {e}",
                allow_module_level=True)

import megatron_cpu as mc  # noqa: E402
import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402
from test_hf_import import _read_dcp  # noqa: E402


def save_worker(rank, world, port, root):
    mc.install()
    model, opt = mc.build(world)
    for i in range(2):
        mc.train_step(model, opt, i, world, rank)
    fmt.save_checkpoint(model, opt, os.path.join(root, "full"))
    fmt.save_checkpoint(model, opt, os.path.join(root, "model"), model_only=True,
                        extra={"train_state": {"step": 2}})


def load_worker(rank, world, port, root):
    mc.install()
    model, opt = mc.build(world, seed=5)  # other initial weights
    with pytest.raises(fm.Incompatible, match=r'model alone\? exclude "optimizer"'):
        fmt.load_checkpoint(model, opt, os.path.join(root, "model"))
    state = {"step": 0}
    report = fmt.load_checkpoint(model, opt, os.path.join(root, "model"),
                                 exclude=["optimizer"], extra={"train_state": state})
    assert report == {} and state == {"step": 2}
    # The optimizer is as a fresh one is: no step taken, moments zero.
    for st in opt.state.values():
        assert "step" not in st or float(st["step"]) == 0
        for role in ("exp_avg", "exp_avg_sq"):
            t = st[role]
            assert not bool((t._local_tensor if hasattr(t, "_local_tensor") else t).any())
    fmt.save_checkpoint(model, opt, os.path.join(root, "loaded"))
    mc.train_step(model, opt, 2, world, rank)


def test_model_only_save_and_excluded_load(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDP_MLIR_CACHE", str(tmp_path / "plans"))
    root = str(tmp_path)
    tp.spawn(save_worker, 2, root)
    fm.verify(tmp_path / "model")
    keys = {k["key"] for k in fm.inspect(tmp_path / "model")["keys"]}
    assert keys and not any(k.startswith("optimizer") for k in keys), sorted(keys)
    assert "train_state.step" in keys

    def data(d):
        return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                   if f.endswith(".distcp") and not f.startswith("__live"))
    ratio = data(tmp_path / "model") / data(tmp_path / "full")
    assert 0.25 < ratio < 0.4, ratio
    full, model = _read_dcp(str(tmp_path / "full")), _read_dcp(str(tmp_path / "model"))
    weights = {k for k in full if k.startswith("model.")}
    assert weights and weights <= set(model)
    for k in weights:
        assert torch.equal(full[k], model[k]), k
    tp.spawn(load_worker, 2, root)
    loaded = _read_dcp(str(tmp_path / "loaded"))
    for k in weights:
        assert torch.equal(loaded[k], full[k]), k
