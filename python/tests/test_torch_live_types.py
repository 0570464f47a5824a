"""Live state that does not fit is named: an extra tensor saved in one shape and loaded into
another, and param-group entries of the wrong type in a checkpoint, raise fm.Incompatible
naming the key (not a bare RuntimeError or TypeError from deep inside torch)."""

import pytest

torch = pytest.importorskip("torch")
fm = pytest.importorskip("fsdp_mlir")

import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402
from fsdp_mlir.torch import _optim  # noqa: E402


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    torch.manual_seed(0)
    model = tp.TinyLlama()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    desc = fmt.describe(model, units=tp.llama_units(model), mesh={"dp": 1}, optimizer=opt,
                        main_grads_dtype="bf16")
    return tp.compile_model(desc, str(tmp_path_factory.mktemp("plan")))


def _packed(compiled):
    plan, layout = compiled
    torch.manual_seed(0)
    packed = tp.pack(tp.TinyLlama(), layout, 0, optimizer="adamw")
    tp.fill(packed, 3)
    packed.attach(plan)
    return packed


class Holder:
    def __init__(self, t, note="x"):
        self.t, self.note = t, note

    def state_dict(self):
        return {"t": self.t, "note": self.note}

    def load_state_dict(self, sd):
        self.t, self.note = sd["t"], sd["note"]


@pytest.mark.parametrize("saved,live,match", [
    (torch.arange(3.0), torch.zeros(5), r"'ema\.t' has shape \[3\] in the checkpoint and \[5\] "
                                        r"here \(strict=False"),
    (torch.arange(3.0), torch.zeros(5, dtype=torch.float64),
     r"'ema\.t' has shape \[3\] in the checkpoint and \[5\] here \(torch\.float32 in the "
     r"checkpoint, torch\.float64 here\)"),
    (torch.arange(6.0).view(2, 3), torch.zeros(3, 2), r"'ema\.t' has shape \[2, 3\]"),
])
def test_extra_tensor_of_another_shape_is_named(tmp_path, compiled, saved, live, match):
    packed = _packed(compiled)
    ck = str(tmp_path / "ck")
    fmt.save_checkpoint(packed.model, packed.optimizer, ck, extra={"ema": Holder(saved)})
    holder = Holder(live.clone())
    with pytest.raises(fm.Incompatible, match=match):
        fmt.load_checkpoint(packed.model, packed.optimizer, ck, extra={"ema": holder})
    assert torch.equal(holder.t, live)
    # strict=False leaves it as it is and says so; the same shape loads (cast to the live dtype).
    report = fmt.load_checkpoint(packed.model, packed.optimizer, ck, extra={"ema": holder},
                                 strict=False)
    assert report == {"left": ["ema.t"]} and torch.equal(holder.t, live)
    same = Holder(torch.zeros(saved.shape, dtype=torch.float64))
    fmt.load_checkpoint(packed.model, packed.optimizer, ck, extra={"ema": same})
    assert same.t.dtype == torch.float64 and torch.equal(same.t, saved.double())


def test_extra_non_tensor_where_a_tensor_belongs_is_named(tmp_path, compiled):
    packed = _packed(compiled)
    ck = str(tmp_path / "ck")
    fmt.save_checkpoint(packed.model, packed.optimizer, ck, extra={"ema": {"t": 7}})
    with pytest.raises(fm.Incompatible, match=r"'ema\.t' holds a int in the checkpoint, a "
                                              r"tensor \[2\] torch\.float32 here"):
        fmt.load_checkpoint(packed.model, packed.optimizer, ck, extra={"ema": {"t": torch.ones(2)}})


def _doctored_save(packed, ck, monkeypatch, group, key, value):
    real = _optim.param_groups_state

    def doctored(*a, **kw):
        groups = real(*a, **kw)
        groups[group][key] = value
        return groups

    monkeypatch.setattr(_optim, "param_groups_state", doctored)
    fmt.save_checkpoint(packed.model, packed.optimizer, ck)
    monkeypatch.setattr(_optim, "param_groups_state", real)


@pytest.mark.parametrize("key,value,match", [
    ("params", 3, r"param group 0 key 'params' holds int 3 in the checkpoint, not a list"),
    ("params", ["a", 2], r"param group 0 key 'params' holds list \['a', 2\]"),
    ("lr", "fast", r"param group 0 key 'lr' holds str 'fast' in the checkpoint, the optimizer's "
                   r"is float 0\.001"),
    ("betas", 0.9, r"param group 0 key 'betas' holds float 0\.9 in the checkpoint, the "
                   r"optimizer's is tuple \(0\.9, 0\.999\)"),
    ("betas", ("a", 0.9), r"param group 0 key 'betas' holds tuple \('a', 0\.9\)"),
    ("amsgrad", 1.5, r"param group 0 key 'amsgrad' holds float 1\.5 in the checkpoint, the "
                     r"optimizer's is bool False"),
    ("weight_decay", [0.1], r"param group 0 key 'weight_decay' holds list \[0\.1\]"),
])
def test_param_group_entry_of_the_wrong_type_is_named(tmp_path, compiled, monkeypatch, key,
                                                      value, match):
    packed = _packed(compiled)
    ck = str(tmp_path / "ck")
    _doctored_save(packed, ck, monkeypatch, 0, key, value)
    before = dict(packed.optimizer.param_groups[0])
    with pytest.raises(fm.Incompatible, match=match):
        fmt.load_checkpoint(packed.model, packed.optimizer, ck)
    # strict=False leaves that key as it is and names it.
    report = fmt.load_checkpoint(packed.model, packed.optimizer, ck, strict=False)
    assert any(key in left for left in report["left"]), report
    after = packed.optimizer.param_groups[0]
    assert after[key] == before[key] if key != "params" else after["params"] == before["params"]


def test_param_group_values_of_the_right_type_load(tmp_path, compiled, monkeypatch):
    packed = _packed(compiled)
    ck = str(tmp_path / "ck")
    # A list where torch keeps a tuple (betas as JSON-ish state has them) and an int for a
    # float are fine: they load, betas as a tuple.
    _doctored_save(packed, ck, monkeypatch, 0, "betas", [0.8, 0.9])
    fmt.load_checkpoint(packed.model, packed.optimizer, ck)
    assert packed.optimizer.param_groups[0]["betas"] == (0.8, 0.9)
    _doctored_save(packed, ck, monkeypatch, 0, "lr", 1)
    fmt.load_checkpoint(packed.model, packed.optimizer, ck)
    assert packed.optimizer.param_groups[0]["lr"] == 1
