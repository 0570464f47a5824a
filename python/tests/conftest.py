"""Fixtures of the fsdp_mlir tests: plans compiled by fm.compile from the
repository's examples (the tools come from PATH or FSDP_MLIR_TOOLS:
scripts/python-tests.sh puts build/bin on PATH)."""

import os
import socket
import subprocess
import sys

import pytest

import fsdp_mlir as fm

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(REPO, "examples")
WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")


def example(name):
    return os.path.join(EXAMPLES, name)


def _have_tools():
    try:
        fm.find_tool("fsdp-translate")
        fm.find_tool("fsdp-opt")
        return True
    except FileNotFoundError:
        return False


@pytest.fixture(scope="session")
def plans(tmp_path_factory):
    """plans(model, world) -> the path of the plan of examples/<model>.json
    for a mesh of `world` ranks ("dp=N"), compiled once per session."""
    if not _have_tools():
        pytest.skip("fsdp-translate/fsdp-opt not found (put build/bin on PATH)")
    root = tmp_path_factory.mktemp("plans")
    made = {}

    def get(model, world=1, mesh=None, placements=None):
        key = (model, world, mesh, placements)
        if key not in made:
            out = root / f"{model}-{len(made)}"
            made[key] = fm.compile(example(model + ".json"), out,
                                   mesh=mesh or f"dp={world}", placements=placements)
        return made[key]

    return get


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, scenario, args, timeout=240):
    """Starts `world` processes of dist_worker.py as torchrun would (env
    MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK) and asserts that every
    rank exits 0."""
    import json

    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   OMP_NUM_THREADS="1", FSDP_THREADS="2")
        procs.append(subprocess.Popen([sys.executable, WORKER, scenario, json.dumps(args)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = []
    failed = False
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
            out += "\n(timed out)"
        outputs.append(out)
        failed |= proc.returncode != 0
    if failed:
        report = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{o}"
                           for r, (p, o) in enumerate(zip(procs, outputs)))
        pytest.fail(f"{scenario} on {world} ranks failed:\n{report}")
