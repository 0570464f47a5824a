"""fsdp_mlir.compile: a model description in, a checkpoint plan out, by the
project's tools (README.md): fsdp-translate --import-model-json, fsdp-opt
--fsdp-lower-fully-shard, fsdp-translate --emit-layout-json and
--emit-checkpoint-plan."""

import json
import os
import shutil
import subprocess

__all__ = ["compile", "find_tool"]

_TOOLS_HINT = ("build the compiler (scripts/setup.sh, then ninja -C build fsdp-opt "
               "fsdp-translate) and put build/bin on PATH, or set FSDP_MLIR_TOOLS to its folder")


def find_tool(name):
    """The path of tool `name`: in $FSDP_MLIR_TOOLS (a folder) when set, else
    beside the package (fsdp_mlir/bin), else on PATH."""
    override = os.environ.get("FSDP_MLIR_TOOLS")
    if override:
        path = os.path.join(override, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise FileNotFoundError(f"{name} is not in FSDP_MLIR_TOOLS={override}")
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(f"fsdp_mlir.compile needs {name}, which is not on PATH: {_TOOLS_HINT}")


def _mesh_text(mesh):
    if mesh is None or isinstance(mesh, str):
        return mesh
    if isinstance(mesh, dict):
        items = mesh.items()
    else:
        items = mesh  # [(name, size), ...]
    parts = []
    for name, size in items:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh axis {name!r}: the size must be a positive integer, not {size!r}")
        parts.append(f"{name}={size}")
    if not parts:
        raise ValueError("mesh: no axes")
    return ",".join(parts)


def _placements_text(placements):
    if placements is None or isinstance(placements, str):
        return placements
    placements = [str(p) for p in placements]
    for p in placements:
        if p not in ("shard", "replicate"):
            raise ValueError(f"placements: {p!r} is neither shard nor replicate")
    return ",".join(placements)


def _run(argv):
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise ValueError(f"{os.path.basename(argv[0])} failed: {message}")


def compile(model_json, out_dir, mesh=None, placements=None):
    """Compiles a model description (a path to fsdp-model-v1 JSON, or the
    description as a dict) into `out_dir` (created): model.mlir,
    lowered.mlir, layout.json and model.fsdpplan. mesh ("dp=4", {"dp": 4}
    or [("dp", 4)]) and placements ("shard", "replicate,shard" or a list)
    override the description's. Returns the path of model.fsdpplan."""
    translate = find_tool("fsdp-translate")
    opt = find_tool("fsdp-opt")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    if isinstance(model_json, dict):
        source = os.path.join(out_dir, "model.json")
        with open(source, "w") as f:
            json.dump(model_json, f, indent=1)
    else:
        source = os.fspath(model_json)
        if not os.path.isfile(source):
            raise FileNotFoundError(f"{source}: no such model description")
    model = os.path.join(out_dir, "model.mlir")
    lowered = os.path.join(out_dir, "lowered.mlir")
    layout = os.path.join(out_dir, "layout.json")
    plan = os.path.join(out_dir, "model.fsdpplan")
    argv = [translate, "--import-model-json", source]
    mesh = _mesh_text(mesh)
    placements = _placements_text(placements)
    if mesh:
        argv += ["--mesh", mesh]
    if placements:
        argv += ["--placements", placements]
    _run(argv + ["-o", model])
    _run([opt, model, "--fsdp-lower-fully-shard", "-o", lowered])
    _run([translate, "--emit-layout-json", lowered, "-o", layout])
    _run([translate, "--emit-checkpoint-plan", lowered, "-o", plan])
    return plan
