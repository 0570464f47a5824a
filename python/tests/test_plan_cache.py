"""The drop-in path's plan cache (fsdp_mlir/torch/_auto.py): nothing read from it is trusted.
A planted plan (the same model with two same-shaped weights swapped) is detected and compiled
again, and the values saved are the model's own; another build of the tools misses the cache;
a broken entry is compiled again instead of failing every save; the root and entries are 0700
whatever the umask, and a root others may write is not used; two processes compiling at once
both get a good plan."""

import importlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
fm = pytest.importorskip("fsdp_mlir")

import torch_packing as tp  # noqa: E402
from fsdp_mlir import torch as fmt  # noqa: E402
from fsdp_mlir.torch import _auto  # noqa: E402
from test_hf_import import _read_dcp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _model():
    torch.manual_seed(0)
    model = tp.TinyLlama()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return model, opt


def _desc(model, opt):
    return fmt.describe(model, units=tp.llama_units(model), mesh={"dp": 1}, optimizer=opt,
                        main_grads_dtype="bf16")


def swapped(desc):
    """`desc` with the first two same-shaped sibling modules (parameters only, in one unit)
    in each other's place: the layout puts each of the two weights where the other one is."""
    desc = json.loads(json.dumps(desc))

    def sig(child):
        return json.dumps({k: v for k, v in child.items() if k != "name"}, sort_keys=True)

    def visit(node):
        kids = node.get("children", [])
        for i, a in enumerate(kids):
            for j in range(i + 1, len(kids)):
                b = kids[j]
                if (a.get("params") and not a.get("children") and "fully_shard" not in a
                        and sig(a) == sig(b)):
                    kids[i], kids[j] = b, a
                    return (a["name"], b["name"])
        for k in kids:
            found = visit(k)
            if found:
                return found
        return None

    assert visit(desc["module"]), "no two same-shaped sibling modules to swap"
    return desc


def _entry(desc):
    return os.path.join(_auto.usable_root(), _auto.cache_key(desc))


def _plant(desc, planted_dir, with_layout=False):
    """The cache entry of `desc` holding the plan (and layout) compiled into planted_dir."""
    final = _entry(desc)
    if not os.path.isdir(final):
        _auto.compiled_plan(desc)
    shutil.copy(os.path.join(planted_dir, "model.fsdpplan"), os.path.join(final, "model.fsdpplan"))
    if with_layout:
        shutil.copy(os.path.join(planted_dir, "layout.json"), os.path.join(final, "layout.json"))
    return final


def _plan_id(plan):
    return json.loads(fm._core.plan_json(plan, 0))["plan_id"]


def _saved_values_are_the_models(packed, ckdir):
    """Every model.<fqn> of the checkpoint holds what the model's main-weight buffer holds
    where the (true) layout puts that parameter."""
    saved = _read_dcp(ckdir)
    checked = 0
    for gi, g, p, ro, rows, lo in packed.pieces():
        rs = tp.row_size(p["shape"])
        mine = packed.buffers[(gi, "main_weight")][lo: lo + rows * rs]
        for fqn in [p["fqn"]] + p.get("tied_fqns", []):
            theirs = saved[f"model.{fqn}"].flatten()[ro * rs: ro * rs + rows * rs]
            assert torch.equal(theirs, mine.to(theirs.dtype)), fqn
            checked += 1
    assert checked > 10


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache" / "plans"
    monkeypatch.setenv("FSDP_MLIR_CACHE", str(root))
    return root


def _count_compiles(monkeypatch):
    calls = []
    real = fm.compile

    def counting(*a, **kw):
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr(fm, "compile", counting)
    return calls


def test_planted_swapped_plan_is_recompiled_and_saves_the_models_values(tmp_path, cache,
                                                                        monkeypatch):
    model, opt = _model()
    desc = _desc(model, opt)
    true_plan, layout = tp.compile_model(desc, str(tmp_path / "true"))
    tp.compile_model(swapped(desc), str(tmp_path / "swapped"))
    final = _plant(desc, str(tmp_path / "swapped"))
    planted = _plan_id(os.path.join(final, "model.fsdpplan"))
    assert planted != _plan_id(true_plan)
    problem = _auto._entry_problem(final, desc, 0)
    assert problem and "elsewhere than its layout" in problem, problem

    calls = _count_compiles(monkeypatch)
    plan = _auto.compiled_plan(desc)
    assert len(calls) == 1 and plan == os.path.join(final, "model.fsdpplan")
    assert _plan_id(plan) == _plan_id(true_plan)
    assert _auto.compiled_plan(desc) == plan and len(calls) == 1  # a good entry is a hit

    # The values saved are the model's own, and a load gives them back.
    packed = tp.pack(model, layout, 0, optimizer="adamw")
    tp.fill(packed, 11)
    packed.attach(plan)
    ck = str(tmp_path / "ck")
    fmt.save_checkpoint(packed.model, packed.optimizer, ck)
    _saved_values_are_the_models(packed, ck)
    want = {k: t.clone() for k, t in packed.buffers.items()}
    for t in packed.buffers.values():
        t.zero_()
    fmt.load_checkpoint(packed.model, packed.optimizer, ck)
    for k, t in packed.buffers.items():
        if k[1] in ("main_weight", "exp_avg", "exp_avg_sq"):
            assert torch.equal(t, want[k]), k


def test_another_build_misses_the_cache(cache, monkeypatch):
    model, opt = _model()
    desc = _desc(model, opt)
    calls = _count_compiles(monkeypatch)
    first = _auto.compiled_plan(desc)
    assert _auto.compiled_plan(desc) == first and len(calls) == 1
    import importlib.metadata as md
    real = md.version
    monkeypatch.setattr(md, "version",
                        lambda name: "999.0" if name == "fsdp_mlir" else real(name))
    second = _auto.compiled_plan(desc)
    assert second != first and len(calls) == 2
    assert "fsdp_mlir 999.0" in _auto.tools_build()
    # A rebuilt tool (another size or modification time) is another build too.
    monkeypatch.setattr(md, "version", real)
    tools = cache.parent / "tools"
    tools.mkdir()
    for name in ("fsdp-translate", "fsdp-opt"):
        shutil.copy(fm.find_tool(name), tools / name)  # a new mtime
    monkeypatch.setenv("FSDP_MLIR_TOOLS", str(tools))
    third = _auto.compiled_plan(desc)
    assert third not in (first, second) and len(calls) == 3


def _break_missing_plan(final):
    os.unlink(os.path.join(final, "model.fsdpplan"))


def _break_garbled_plan(final):
    path = os.path.join(final, "model.fsdpplan")
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] + b"\x5a" * 64)


def _break_leftover(final):
    shutil.rmtree(final)
    os.makedirs(final)
    open(os.path.join(final, "junk"), "w").write("a crash left this")


def _break_other_description(final):
    path = os.path.join(final, "model.json")
    desc = json.load(open(path))
    desc["mesh"][0]["size"] = 2
    json.dump(desc, open(path, "w"))


def _break_garbled_layout(final):
    open(os.path.join(final, "layout.json"), "w").write('{"format": "fsdp-layout-v1", "gro')


@pytest.mark.parametrize("damage", [_break_missing_plan, _break_garbled_plan, _break_leftover,
                                    _break_other_description, _break_garbled_layout],
                         ids=["no-plan", "garbled-plan", "leftover-dir", "other-model-json",
                              "garbled-layout"])
def test_broken_entry_is_recompiled(tmp_path, cache, monkeypatch, damage):
    model, opt = _model()
    desc = _desc(model, opt)
    plan = _auto.compiled_plan(desc)
    final = os.path.dirname(plan)
    damage(final)
    assert _auto._entry_problem(final, desc, 0) is not None
    calls = _count_compiles(monkeypatch)
    assert _auto.compiled_plan(desc) == plan and len(calls) == 1
    assert _auto._entry_problem(final, desc, 0) is None
    # Nothing is left beside the entry (no staging directory, no stale copy).
    assert sorted(os.listdir(os.path.dirname(final))) == [os.path.basename(final)]
    # And it saves: the plan fits the model.
    _, layout = tp.compile_model(desc, str(tmp_path / "layout"))
    packed = tp.pack(model, layout, 0, optimizer="adamw")
    tp.fill(packed, 5)
    packed.attach(plan)
    fmt.save_checkpoint(packed.model, packed.optimizer, str(tmp_path / "ck"))
    _saved_values_are_the_models(packed, str(tmp_path / "ck"))


def test_umask_000_gives_private_root_and_entries(tmp_path, monkeypatch):
    root = tmp_path / "a" / "b" / "plans"
    monkeypatch.setenv("FSDP_MLIR_CACHE", str(root))
    model, opt = _model()
    old = os.umask(0)
    try:
        plan = _auto.compiled_plan(_desc(model, opt))
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", root, os.path.dirname(plan)):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d


def test_root_others_may_write_is_not_used(tmp_path, monkeypatch):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("FSDP_MLIR_CACHE", str(root))
    monkeypatch.setattr(_auto, "_private_roots", [])
    model, opt = _model()
    with pytest.warns(RuntimeWarning, match=r"writable by its group or others.*not used"):
        plan = _auto.compiled_plan(_desc(model, opt))
    assert os.listdir(root) == [] and not plan.startswith(str(root))
    assert stat.S_IMODE(os.stat(_auto._private_roots[0]).st_mode) == 0o700
    assert _auto._entry_problem(os.path.dirname(plan), _desc(model, opt), 0) is None


COMPILER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {here!r})
    import torch
    import torch_packing as tp
    from fsdp_mlir import torch as fmt
    from fsdp_mlir.torch import _auto
    torch.manual_seed(0)
    model = tp.TinyLlama()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    desc = fmt.describe(model, units=tp.llama_units(model), mesh={{"dp": 1}}, optimizer=opt,
                        main_grads_dtype="bf16")
    open(sys.argv[1], "w").write("go")
    import time
    while open(sys.argv[2]).read() != "go":
        time.sleep(0.005)
    print(_auto.compiled_plan(desc))
""")


@pytest.mark.parametrize("start", ["empty", "broken"])
def test_two_processes_compiling_at_once(tmp_path, cache, start):
    model, opt = _model()
    desc = _desc(model, opt)
    if start == "broken":
        _break_leftover(os.path.dirname(_auto.compiled_plan(desc)))
    script = tmp_path / "compile.py"
    script.write_text(COMPILER.format(here=HERE))
    gate = tmp_path / "gate"
    gate.write_text("wait")
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / f"ready{i}"),
                               str(gate)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for i in range(2)]
    import time
    deadline = time.time() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.time() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate() for p in procs]
        time.sleep(0.05)
    gate.write_text("go")  # both start compiling together
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "leaked" not in err, err
    plans = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(plans) == 1
    plan = plans.pop()
    assert _auto._entry_problem(os.path.dirname(plan), desc, 0) is None
    assert sorted(os.listdir(cache)) == [os.path.basename(os.path.dirname(plan))]


# --- the drop-in path end to end: Megatron-FSDP 0.6.1 on CPU ------------------------------


def _megatron():
    try:
        importlib.import_module("megatron_fsdp.experimental")
    except Exception as e:  # not installed here
        pytest.skip(f"megatron-fsdp (experimental) is not importable here: {e}")
    import megatron_cpu as mc
    return mc


def planted_drop_in_worker(rank, world, port, tmp, with_layout):
    import megatron_cpu as mc
    mc.install()
    model, opt = mc.build(world)
    desc = _auto.description_of(model, opt, "test")
    tp.compile_model(swapped(desc), os.path.join(tmp, "swapped"))
    final = _plant(desc, os.path.join(tmp, "swapped"), with_layout=with_layout)
    planted = _plan_id(os.path.join(final, "model.fsdpplan"))
    # A fresh model: the entry above is what the drop-in save finds.
    model, opt = mc.build(world)
    mc.train_step(model, opt, 0, world, rank)
    ck = os.path.join(tmp, "ck")
    fmt.save_checkpoint(model, opt, ck)
    assert _plan_id(os.path.join(final, "model.fsdpplan")) != planted
    att = fmt.attached(model)
    saved = _read_dcp(ck)
    own = {}
    for g in att.groups:
        main = att.buffers[(g.index, "main_weight")]
        for m in g.members:
            view = main[m.local_offset: m.local_offset + m.rows * m.row_size]
            own[m.fqn] = view.clone()
            assert torch.equal(saved[f"model.{m.fqn}"].flatten().to(view.dtype), view), m.fqn
    assert len(own) > 10
    # A load into a model trained otherwise gives the model's values back.
    model2, opt2 = mc.build(world, seed=3)
    fmt.load_checkpoint(model2, opt2, ck)
    att2 = fmt.attached(model2)
    for g in att2.groups:
        main = att2.buffers[(g.index, "main_weight")]
        for m in g.members:
            assert torch.equal(main[m.local_offset: m.local_offset + m.rows * m.row_size],
                               own[m.fqn]), m.fqn


@pytest.mark.parametrize("with_layout", [False, True], ids=["plan", "plan-and-layout"])
def test_drop_in_planted_swapped_entry_is_recompiled(tmp_path, cache, with_layout):
    _megatron()
    tp.spawn(planted_drop_in_worker, 1, str(tmp_path), with_layout)


LEAK_SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {here!r})
    import torch_packing as tp

    def worker(rank, world, port, ck):
        import megatron_cpu as mc
        from fsdp_mlir import torch as fmt
        mc.install()
        model, opt = mc.build(world)
        mc.train_step(model, opt, 0, world, rank)
        fmt.save_checkpoint(model, opt, ck, extra={{"rng": fmt.RNGState()}})
        h = fmt.save_checkpoint(model, opt, ck + "-async", async_save=True)
        h.wait()
        fmt.load_checkpoint(model, opt, ck, extra={{"rng": fmt.RNGState()}})

    if __name__ == "__main__":
        tp.spawn(worker, int(sys.argv[2]), sys.argv[1])
        print("done")
""")


@pytest.mark.parametrize("world", [1, 2])
def test_drop_in_process_exits_without_nanobind_leaks(tmp_path, cache, world):
    _megatron()
    script = tmp_path / "leak.py"
    script.write_text(LEAK_SCRIPT.format(here=HERE))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "ck"), str(world)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr
    assert "leaked" not in r.stderr, r.stderr
