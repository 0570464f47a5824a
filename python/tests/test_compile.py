"""fsdp_mlir.compile: the project's tools, from a description to a plan."""

import json
import os

import pytest

import fsdp_mlir as fm
from conftest import example


@pytest.fixture(autouse=True)
def tools():
    try:
        fm.find_tool("fsdp-translate")
        fm.find_tool("fsdp-opt")
    except FileNotFoundError:
        pytest.skip("fsdp-translate/fsdp-opt not found (put build/bin on PATH)")


def test_compile_writes_every_output(tmp_path):
    out = tmp_path / "out" / "nested"
    plan = fm.compile(example("worked-example.json"), out_dir=out, mesh="dp=4",
                      placements="shard")
    assert plan == os.path.join(str(out), "model.fsdpplan") and os.path.isfile(plan)
    for name in ("model.mlir", "lowered.mlir", "layout.json"):
        assert os.path.isfile(out / name), name
    layout = json.load(open(out / "layout.json"))
    assert layout["mesh"] == [{"name": "dp", "size": 4}]
    assert fm.Checkpointer(plan, rank=1, world_size=4).world_size == 4


def test_mesh_forms(tmp_path):
    for i, mesh in enumerate(["dp=2", {"dp": 2}, [("dp", 2)]]):
        plan = fm.compile(example("llama-tiny.json"), tmp_path / str(i), mesh=mesh)
        assert fm.Checkpointer(plan, rank=0, world_size=2).world_size == 2
    # The description's own mesh when not overridden (llama-tiny: dp=4).
    plan = fm.compile(example("llama-tiny.json"), tmp_path / "own")
    assert fm.Checkpointer(plan, rank=3, world_size=4).rank == 3
    with pytest.raises(ValueError, match="positive integer"):
        fm.compile(example("llama-tiny.json"), tmp_path / "bad", mesh={"dp": 0})


def test_hsdp_placements(tmp_path):
    plan = fm.compile(example("worked-example.json"), tmp_path, mesh={"dp_outer": 2, "dp_shard": 2},
                      placements=["replicate", "shard"])
    layout = json.load(open(tmp_path / "layout.json"))
    assert [m["size"] for m in layout["mesh"]] == [2, 2]
    assert fm.Checkpointer(plan, rank=0, world_size=4).buffers
    with pytest.raises(ValueError, match="neither shard nor replicate"):
        fm.compile(example("worked-example.json"), tmp_path / "x", placements=["sharded"])


def test_compile_a_description_dict(tmp_path):
    description = json.load(open(example("worked-example.json")))
    plan = fm.compile(description, tmp_path, mesh="dp=1")
    assert os.path.isfile(tmp_path / "model.json")
    ck = fm.Checkpointer(plan)
    assert [b["elements"] for b in ck.buffers] == [48] * 5


def test_bad_description_is_a_value_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "fsdp-model-v1", "mesh": []}')
    with pytest.raises(ValueError, match="fsdp-translate failed"):
        fm.compile(bad, tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        fm.compile(tmp_path / "missing.json", tmp_path / "out")


def test_missing_tool_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDP_MLIR_TOOLS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="fsdp-translate"):
        fm.compile(example("worked-example.json"), tmp_path / "out")
    # The override is a folder holding the tools.
    real = os.path.dirname(fm.find_tool.__globals__["shutil"].which("fsdp-opt") or "")
    if real:
        monkeypatch.setenv("FSDP_MLIR_TOOLS", real)
        assert fm.find_tool("fsdp-opt") == os.path.join(real, "fsdp-opt")
    monkeypatch.delenv("FSDP_MLIR_TOOLS")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="fsdp-opt|fsdp-translate"):
        fm.find_tool("fsdp-opt")
