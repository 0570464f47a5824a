"""Starting from a Hugging Face model, as a fine-tuning job does: Checkpointer.load(dir,
source="hf") and fm.torch.load_pretrained read safetensors (written here by the safetensors
package and by transformers' save_pretrained, no hub) into the packed layout, each value equal
to the file's cast to the main-weight dtype, optimizer state zero with step 0; a Megatron-FSDP
model on FSDP 4 and HSDP 2x2 loads a transformers Llama, trains one step, and its export loads
back into transformers; a hub cache's snapshot (links into its blobs, no hub access) loads,
other links out are refused. Errors: a tensor missing, another shape, a dtype that does not cast,
hostile files, bad key maps. Also load(only=/exclude=) on DCP checkpoints."""

import importlib
import os

import pytest

import fsdp_mlir as fm

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture
def plan1(plans):
    return plans("worked-example", 1)


def _ck(plan):
    c = fm.Checkpointer(plan)
    c.allocate()
    return c


def _members(ck):
    """{fqn: (group, local_offset, shape)} of the worked example on one rank (layout.json)."""
    import json
    layout = json.load(open(os.path.join(os.path.dirname(ck.plan), "layout.json")))
    out = {}
    for g, group in enumerate(layout["groups"]):
        for p in group["params"]:
            (chunk,) = p["chunks"]
            out[p["fqn"]] = (g, chunk["local_offset"], tuple(p["shape"]))
    return out


def _weights(seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    shapes = {"p0": (5, 3), "p1": (7,), "p2": (4, 4)}
    return {n: torch.randn(s, generator=g).to(dtype) for n, s in shapes.items()}


def _main(ck, group, offset, shape):
    numel = 1
    for s in shape:
        numel *= s
    return ck.tensor(group, "main_weight")[offset:offset + numel].view(shape)


def test_values_cast_state_zeroed_step_zero(tmp_path, plan1):
    weights = _weights()
    safetensors_torch.save_file(weights, str(tmp_path / "model.safetensors"))
    ck = _ck(plan1)
    ck.fill(3)  # state that must be zeroed
    result = ck.load(tmp_path, source="hf")
    assert result["step"] == 0.0 and result["bytes_items"] == {}
    for fqn, (g, off, shape) in _members(ck).items():
        assert torch.equal(_main(ck, g, off, shape), weights[fqn].float()), fqn
        numel = _main(ck, g, off, shape).numel()
        for role in ("exp_avg", "exp_avg_sq"):
            assert not ck.tensor(g, role)[off:off + numel].any(), (fqn, role)
        # model_weight (bf16) refreshed from the main weights
        mw = ck.tensor(g, "model_weight")[off:off + numel].view(shape)
        assert torch.equal(mw, weights[fqn]), fqn
    assert fm.hf_tensors(tmp_path) == {n: ("bfloat16", tuple(t.shape), "model.safetensors")
                                       for n, t in weights.items()}


def test_sharded_and_key_maps(tmp_path, plan1):
    weights = _weights(1, torch.float16)
    prefixed = {"base." + n: t for n, t in weights.items()}
    prefixed["rotary.inv_freq"] = torch.ones(3)  # not in the plan: left out by the map
    hf = tmp_path / "hf"
    hf.mkdir()
    files = {}
    for i, (name, t) in enumerate(sorted(prefixed.items())):
        file = f"model-{i + 1:05d}-of-{len(prefixed):05d}.safetensors"
        safetensors_torch.save_file({name: t}, str(hf / file))
        files[name] = file
    import json
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": files}))
    ck = _ck(plan1)
    with pytest.raises(fm.Incompatible, match=r"model.p0: .* has no tensor 'p0' \(4 tensors"):
        ck.load(hf, source="hf")
    ck.load(hf, source="hf",
            key_map=lambda n: n[len("base."):] if n.startswith("base.") else None)
    for fqn, (g, off, shape) in _members(ck).items():
        assert torch.equal(_main(ck, g, off, shape), weights[fqn].float()), fqn
    ck.fill(0)
    ck.load(hf, source="hf", key_map={f"base.{n}": n for n in weights})
    for fqn, (g, off, shape) in _members(ck).items():
        assert torch.equal(_main(ck, g, off, shape), weights[fqn].float()), fqn
    with pytest.raises(ValueError, match="the same FQN 'p0'"):
        ck.load(hf, source="hf", key_map={"base.p0": "p0", "base.p1": "p0"})
    with pytest.raises(ValueError, match="gives 'base.p0' the FQN 3"):
        ck.load(hf, source="hf", key_map={"base.p0": 3})
    with pytest.raises(TypeError, match="key_map is a dict"):
        ck.load(hf, source="hf", key_map=["base."])
    with pytest.raises(ValueError, match="source must be 'dcp' or 'hf'"):
        ck.load(hf, source="safetensors")
    with pytest.raises(ValueError, match="key_map renames the tensors of a Hugging Face"):
        ck.load(hf, key_map={})


def test_what_does_not_fit_and_hostile_files(tmp_path, plan1):
    ck = _ck(plan1)
    cases = {
        "shape": ({**_weights(), "p1": torch.zeros(8)}, fm.Incompatible,
                  r"model.p1: 'p1' in .*model.safetensors has shape \[8\], the plan expects \[7\]"),
        "dtype": ({**_weights(), "p1": torch.zeros(7, dtype=torch.int64)}, fm.Incompatible,
                  "is int64, which does not cast to the float32 main weights"),
        "missing": ({k: v for k, v in _weights().items() if k != "p2"}, fm.Incompatible,
                    "has no tensor 'p2'"),
    }
    for name, (tensors, error, message) in cases.items():
        d = tmp_path / name
        d.mkdir()
        safetensors_torch.save_file(tensors, str(d / "model.safetensors"))
        with pytest.raises(error, match=message):
            ck.load(d, source="hf")
    d = tmp_path / "hostile"
    d.mkdir()
    (d / "model.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(fm.Corrupt, match="the header length 1099511627776 passes"):
        ck.load(d, source="hf")
    with pytest.raises(fm.Corrupt, match="passes"):
        fm.hf_tensors(d)
    with pytest.raises(fm.NotFound, match="holds neither model.safetensors"):
        ck.load(tmp_path, source="hf")


def test_only_and_exclude(tmp_path, plan1):
    ck = _ck(plan1)
    ck.fill(5)
    ck.save(tmp_path / "ck", step=4.0)
    ck.fill(6)
    result = ck.load(tmp_path / "ck", exclude=["optimizer"])
    assert result["step"] is None and result["bytes_items"] == {}
    for fqn, (g, off, shape) in _members(ck).items():
        numel = _main(ck, g, off, shape).numel()
        saved = _ck(plan1)
        saved.fill(5)
        fresh = _ck(plan1)
        fresh.fill(6)
        assert torch.equal(ck.tensor(g, "main_weight")[off:off + numel],
                           saved.tensor(g, "main_weight")[off:off + numel]), fqn
        assert torch.equal(ck.tensor(g, "exp_avg")[off:off + numel],
                           fresh.tensor(g, "exp_avg")[off:off + numel]), fqn
    result = ck.load(tmp_path / "ck", only=["optimizer"])
    assert result["step"] == 4.0 and set(result["bytes_items"]) and all(
        k.startswith("optimizer.") for k in result["bytes_items"])
    ck.check(5)
    with pytest.raises(ValueError, match="non-empty key prefixes"):
        ck.load(tmp_path / "ck", only=[""])
    with pytest.raises(ValueError, match="only/exclude select keys of a DCP checkpoint"):
        ck.load(tmp_path / "ck", source="hf", exclude=["optimizer"])


# ---------------------------------------------------------------------------------------------
# A Hugging Face hub cache (what huggingface_hub.snapshot_download leaves)

HUB_REV = "89abcdef0123456789abcdef0123456789abcdef"


def _hub_snapshot(root, files):
    """<root>/models--t--tiny as huggingface_hub lays out its cache: each of `files` ({name:
    bytes}) a blob named by its sha256, linked from snapshots/<rev>/<name> by the relative
    link ../../blobs/<sha256>; returns the snapshot directory."""
    import hashlib
    repo = root / "models--t--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HUB_REV)
    snapshot = repo / "snapshots" / HUB_REV
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / sha).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", sha), snapshot / name)
    return snapshot


def _sharded_files(tensors, names_per_shard):
    files, weight_map = {}, {}
    for i, names in enumerate(names_per_shard):
        file = f"model-{i + 1:05d}-of-{len(names_per_shard):05d}.safetensors"
        files[file] = safetensors_torch.save({n: tensors[n].contiguous() for n in names},
                                             metadata={"format": "pt"})
        weight_map.update({n: file for n in names})
    import json
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": weight_map}).encode()
    files["config.json"] = b'{"model_type": "test"}'
    return files


def test_hub_snapshot_loads_and_foreign_links_are_refused(tmp_path, plan1):
    weights = _weights(2)
    snapshot = _hub_snapshot(tmp_path / "hub", _sharded_files(weights, [["p0"], ["p1", "p2"]]))
    assert os.readlink(snapshot / "model.safetensors.index.json").startswith("../../blobs/")
    ck = _ck(plan1)
    ck.fill(3)
    ck.load(snapshot, source="hf")
    for fqn, (g, off, shape) in _members(ck).items():
        assert torch.equal(_main(ck, g, off, shape), weights[fqn].float()), fqn
    assert fm.hf_tensors(snapshot)["p1"] == ("bfloat16", (7,), "model-00002-of-00002.safetensors")
    # Refused, as an invalid argument naming the link and where it leads: a link out of
    # blobs/, a blob that is itself a link (from-hf-hub.test has chains, directories, FIFOs).
    single = _hub_snapshot(tmp_path / "out", {"model.safetensors": b"unused"})
    outside = tmp_path / "out" / "outside.safetensors"  # beside the repo, out of blobs/
    outside.write_bytes(safetensors_torch.save(weights))
    os.unlink(single / "model.safetensors")
    os.symlink(os.path.join("..", "..", "..", "outside.safetensors"), single / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors -> \.\./\.\./\.\./outside.safetensors: "
                                         r"refused: a hub snapshot's links are followed only "
                                         r"straight to a regular file in .*blobs, and this one "
                                         r"leads to .*outside.safetensors"):
        ck.load(single, source="hf")
    with pytest.raises(ValueError, match="refused"):
        fm.hf_tensors(single)
    chained = _hub_snapshot(tmp_path / "blob-link", {"model.safetensors": b"x"})
    blob = os.path.realpath(chained / "model.safetensors")
    os.unlink(blob)
    os.symlink(str(outside), blob)
    with pytest.raises(ValueError, match="is itself a symbolic link"):
        ck.load(chained, source="hf")
    # Outside a hub snapshot any link out of the directory is refused the same way.
    plain = tmp_path / "plain"
    plain.mkdir()
    os.symlink(str(outside), plain / "model.safetensors")
    with pytest.raises(ValueError, match="a symbolic link out of the model directory"):
        ck.load(plain, source="hf")


def test_load_pretrained_from_a_hub_snapshot(tmp_path):
    import torch_packing as tp
    from fsdp_mlir import torch as fmt
    torch.manual_seed(0)
    model = tp.TinyLlama()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    d = fmt.describe(model, units=tp.llama_units(model), mesh={"dp": 1}, optimizer=opt)
    plan, layout = tp.compile_model(d, str(tmp_path / "plan"))
    packed = tp.pack(model, layout, 0)
    tp.fill(packed, 9)  # weights and moments a pretrained load must replace
    packed.attach(plan)
    # The pretrained model: other values, tied lm_head saved once (as transformers does).
    torch.manual_seed(1)
    source = tp.TinyLlama()
    tensors = {n: p.detach().clone() for n, p in source.named_parameters()}
    names = sorted(tensors)
    snapshot = _hub_snapshot(tmp_path / "hub", _sharded_files(
        tensors, [names[: len(names) // 2], names[len(names) // 2:]]))
    fmt.load_pretrained(packed.model, snapshot, packed.optimizer)
    for name, p in packed.model.named_parameters():
        assert torch.equal(p.detach().float(), tensors[name].float()), name
    for st in packed.optimizer.state.values():
        assert not st["exp_avg"].any() and not st["exp_avg_sq"].any()
        assert float(st["step"]) == 0.0


# ---------------------------------------------------------------------------------------------
# A Megatron-FSDP job starting from a transformers Llama


def _megatron():
    try:
        importlib.import_module("megatron_fsdp.experimental")
        importlib.import_module("transformers")
    except Exception as e:
        pytest.skip(f"megatron-fsdp (experimental) or transformers is not importable: {e}")


LLAMA = dict(vocab_size=96, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
             max_position_embeddings=64, rms_norm_eps=1e-6)


def _write_llama(out):
    """A LlamaForCausalLM with mc.CpuLlama's names and shapes, saved by transformers in bf16
    as shards and their index; returns its tensors."""
    import transformers
    torch.manual_seed(4321)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="20KB")
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def pretrained_worker(rank, world, port, hf, ck, kw):
    import megatron_cpu as mc
    from fsdp_mlir import torch as fmt
    mc.install()
    model, opt = mc.build(world, hsdp=kw.get("hsdp", False), frozen=False, lr=1e-3)
    mc.train_step(model, opt, 0, world, rank)  # state a pretrained load must reset
    fmt.load_pretrained(model, hf, opt)
    for p, st in opt.state.items():
        for role, t in st.items():
            local = t._local_tensor if hasattr(t, "_local_tensor") else t
            assert not bool(torch.as_tensor(local).any()), (role, "not zero after load")
    fmt.save_checkpoint(model, opt, ck)
    mc.train_step(model, opt, 1, world, rank)
    fmt.save_checkpoint(model, opt, ck + "-trained")


def _read_dcp(path):
    import warnings
    import torch.distributed.checkpoint as dcp
    reader = dcp.FileSystemReader(path)
    md = reader.read_metadata()
    state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype)
             for k, v in md.state_dict_metadata.items() if hasattr(v, "size")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader)
    return state


@pytest.mark.parametrize("kw", [pytest.param(dict(world=4), id="fsdp4"),
                                pytest.param(dict(world=4, hsdp=True), id="hsdp2x2")])
def test_megatron_job_from_transformers_llama(tmp_path, kw, monkeypatch):
    _megatron()
    import torch_packing as tp
    import transformers
    monkeypatch.setenv("FSDP_MLIR_CACHE", str(tmp_path / "plans"))
    hf, ck = str(tmp_path / "hf"), str(tmp_path / "ck")
    original = _write_llama(hf)
    assert os.path.exists(os.path.join(hf, "model.safetensors.index.json"))
    tp.spawn(pretrained_worker, kw["world"], hf, ck, kw)
    # torch.distributed.checkpoint reads what was loaded: every value the file's, cast.
    loaded = _read_dcp(ck)
    for name, t in original.items():
        assert torch.equal(loaded["model." + name], t.float()), name
    assert all(not bool(v.any()) for k, v in loaded.items() if k.startswith("optimizer.state."))
    # One step later, exported back: transformers loads it, every weight moved by the step.
    out = str(tmp_path / "export")
    fm.export_safetensors(ck + "-trained", out, dtype="bf16")
    transformers.LlamaConfig(**LLAMA).save_pretrained(out)
    back, info = transformers.LlamaForCausalLM.from_pretrained(
        out, torch_dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    trained = _read_dcp(ck + "-trained")
    for name, t in back.state_dict().items():
        assert torch.equal(t, trained["model." + name].to(torch.bfloat16)), name
        moved = (trained["model." + name] - original[name].float()).abs().max().item()
        assert 0 < moved < 1e-2, (name, moved)
