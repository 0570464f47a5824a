"""fm.export_safetensors: a checkpoint's model as Hugging Face safetensors, read back
with the safetensors package, and with hf_config by transformers (the command line's own
tests: test/Tools/fsdp-ckpt/export.test, export-hf-config.test)."""
import json

import numpy as np
import pytest

import fsdp_mlir as fm

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def fnv1a32(text):
    h = 2166136261
    for b in text.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def expected_values(key, shape, seed):
    index = np.arange(int(np.prod(shape)), dtype=np.uint64)
    n = (index * np.uint64(7919) + np.uint64(seed * 104729) + np.uint64(fnv1a32(key))) % np.uint64(65521)
    return torch.from_numpy((n.astype(np.int64) - 32760).astype(np.float32) / np.float32(256)).reshape(shape)


@pytest.fixture
def saved(tmp_path, plans):
    ck = fm.Checkpointer(plans("worked-example", 1), comm=None)
    ck.allocate()
    ck.fill(3)
    ck.save(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_export_reads_back_with_every_value(saved, tmp_path):
    result = fm.export_safetensors(saved, tmp_path / "st")
    assert result["files"] == ["model.safetensors"]
    tensors = safetensors_torch.load_file(str(tmp_path / "st" / "model.safetensors"))
    assert result["tensors"] == len(tensors) > 0
    for name, tensor in tensors.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, expected_values("model." + name, list(tensor.shape), 3)), name


def test_export_casts_and_shards(saved, tmp_path):
    result = fm.export_safetensors(saved, tmp_path / "st", dtype="bf16", max_shard_size="40")
    assert "model.safetensors.index.json" in result["files"]
    index = json.load(open(tmp_path / "st" / "model.safetensors.index.json"))
    for name, file in index["weight_map"].items():
        tensor = safetensors_torch.load_file(str(tmp_path / "st" / file))[name]
        assert tensor.dtype == torch.bfloat16
        want = expected_values("model." + name, list(tensor.shape), 3).to(torch.bfloat16)
        assert torch.equal(tensor, want), name


def test_export_errors(saved, tmp_path):
    fm.export_safetensors(saved, tmp_path / "st")
    with pytest.raises(ValueError, match="already exists"):
        fm.export_safetensors(saved, tmp_path / "st")
    with pytest.raises(ValueError, match="dtype"):
        fm.export_safetensors(saved, tmp_path / "x", dtype="int8")
    with pytest.raises(ValueError, match="not a size"):
        fm.export_safetensors(saved, tmp_path / "x", max_shard_size="5XB")
    with pytest.raises(fm.NotFound):
        fm.export_safetensors(tmp_path / "missing", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_export_with_hf_config_loads_in_transformers(tmp_path):
    """A tiny Llama saved with fill(5): exported with hf_config (a LlamaConfig written by
    save_pretrained, plus a tokenizer file), transformers' from_pretrained(out) loads it with
    nothing copied by hand, every weight the checkpoint's."""
    import os
    import subprocess
    import sys
    transformers = pytest.importorskip("transformers")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    cfg = tmp_path / "cfg"
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        max_position_embeddings=64, rms_norm_eps=1e-6)
    config.save_pretrained(cfg)
    (cfg / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    (cfg / "notes.txt").write_text("not copied")
    model_json = tmp_path / "llama.json"
    subprocess.run([sys.executable, os.path.join(root, "scripts", "gen_llama_model.py"),
                    "--config", str(cfg / "config.json"), "--mesh", "dp=1", "-o",
                    str(model_json)], check=True)
    ck = fm.Checkpointer(fm.compile(model_json, tmp_path / "plan"), comm=None)
    ck.allocate()
    ck.fill(5)
    ck.save(tmp_path / "ckpt")
    out = tmp_path / "export"
    result = fm.export_safetensors(tmp_path / "ckpt", out, hf_config=cfg)
    assert result["config_files"][0] == "config.json"
    assert "tokenizer_config.json" in result["config_files"]
    assert (out / "config.json").read_bytes() == (cfg / "config.json").read_bytes()
    assert not (out / "notes.txt").exists()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(kind), (kind, info[kind])
    assert type(model).__name__ == "LlamaForCausalLM"
    state = model.state_dict()
    exported = safetensors_torch.load_file(str(out / "model.safetensors"))
    assert set(exported) == {n for n in state if not n.endswith("rotary_emb.inv_freq")}
    for name, tensor in exported.items():
        want = expected_values("model." + name, list(tensor.shape), 5)
        assert torch.equal(state[name], want), name
    # Errors name the directory or file at fault; nothing is written.
    with pytest.raises(fm.NotFound, match="no such directory"):
        fm.export_safetensors(tmp_path / "ckpt", tmp_path / "x", hf_config=tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(fm.NotFound, match=r"empty/config.json: missing"):
        fm.export_safetensors(tmp_path / "ckpt", tmp_path / "x", hf_config=tmp_path / "empty")
    assert not (tmp_path / "x").exists()
    # overwrite=True: the new export's config files replace the old ones, others stay.
    (out / "config.json").write_text('{"old": true}')
    (out / "mine.txt").write_text("kept")
    fm.export_safetensors(tmp_path / "ckpt", out, overwrite=True, hf_config=cfg)
    assert (out / "config.json").read_bytes() == (cfg / "config.json").read_bytes()
    assert (out / "mine.txt").read_text() == "kept"


def test_verify_says_what_it_covered(saved):
    """fm.verify(verdict=True): every byte of ours (its .fsdp-index), only the zip records'
    CRCs of a checkpoint PyTorch wrote (the one the export tests read too)."""
    import os
    torch_ckpt = os.path.join(os.path.dirname(__file__), "..", "..", "test", "Inputs",
                              "torch-fsdp2-ws2", "checkpoint")
    assert fm.verify(saved) is True
    assert fm.verify(saved, verdict=True) == "every byte is covered and matches"
    assert fm.verify(torch_ckpt) is True
    assert fm.verify(torch_ckpt, verdict=True) == (
        "every record's CRC matches; bytes between records are not covered without .fsdp-index")
