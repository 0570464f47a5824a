"""fm.export_safetensors: a checkpoint's model as Hugging Face safetensors, read back
with the safetensors package (the command line's own tests: test/Tools/fsdp-ckpt/export.test)."""
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
