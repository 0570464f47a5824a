#!/usr/bin/env python3
"""Makes a test fixture from a real PyTorch DCP checkpoint written by a given
torch version: a one-off tool for people, never run by CI or scripts/test.sh.

    scripts/make_torch_fixture.py 2.15.0                  # -> test/Inputs/torch-2.15.0-ws2/
    scripts/make_torch_fixture.py 2.4.1 --out DIR [--python 3.12.1] [--venv /tmp/torch-2.4.1]

What it does:
  1. Makes a throwaway venv (default /tmp/torch-VERSION, reused when it
     already imports that torch) with a Python from /root/.pyenv/versions or
     PATH, and `pip install torch==VERSION numpy` from PyPI (the CUDA wheels:
     a few GB; nothing here needs a GPU; dcp.save's object collectives need
     numpy).
  2. Runs this same file inside the venv (--generate), which spawns 2 CPU
     processes (gloo, torch.multiprocessing, a TCP store on 127.0.0.1) that
     build the model below, shard it with FSDP2 `fully_shard`, take two AdamW
     steps (lr 0.02), and save
         dcp.save({"model": msd, "optimizer": osd,
                   "extra": {"plain": tensor, "note": "hello"}})
     where msd/osd come from torch.distributed.checkpoint.state_dict.get_state_dict.
     Before 2.5 FSDP2's forward needs CUDA (2.4.1 fails on a CPU-only machine),
     so there the gradients come from an unsharded replica instead (see
     train_on_replica); the checkpoint path is the same. 2.4.1, 2.8.0 and
     2.15.0 were run; 2.5-2.7 were not tried.
  3. Back in one process, reads the checkpoint with PyTorch
     (format_utils.dcp_to_torch_save + torch.load) and writes into the output
     directory:
       checkpoint/   the checkpoint as written (.metadata, __0_0.distcp, __1_0.distcp)
       values.json   world_size, torch version, files, the chunks .metadata
                     records for every key (`metadata`), and for every key what
                     PyTorch reads back (`values`): shape, dtype and all values
                     row-major as JSON numbers (bf16 values are exact as
                     numbers), non-tensor entries as their repr (`object`)
       model.json    the model as an fsdp-model-v1 description, so that
                     fsdp-translate --import-model-json builds a plan naming
                     the same checkpoint keys (the "extra.*" keys aside)
     and prints `python -m pickletools` of .metadata to metadata.dis.txt in the
     work directory for people comparing versions. The README.md of a fixture
     is written by hand.

The model: root (fully_shard unit, no params of its own) with
  fc1    Linear(8, 16)            f32, unit
  fc2    Linear(16, 4)            f32, unit
  worked p0 [5,3], p1 [7], p2 [4,4]  f32, unit (uneven Shard(0) chunks on 2 ranks)
  frozen table [5,4], gain [3]    bf16, requires_grad=False, unit (no optimizer state)
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORLD_SIZE = 2
LR = 0.02
WEIGHT_DECAY = 0.01


# --- outside the venv ------------------------------------------------------------

def pick_python(wanted):
    """A Python that the torch wheels support (3.12 suits 2.4 to 2.15)."""
    candidates = [wanted] if wanted else ["3.12", "3.11", "3.10"]
    pyenv = "/root/.pyenv/versions"
    for want in candidates:
        if os.path.isdir(pyenv):
            for name in sorted(os.listdir(pyenv), reverse=True):
                if name == want or name.startswith(want + "."):
                    return os.path.join(pyenv, name, "bin", "python3")
        exe = shutil.which("python" + want)
        if exe:
            return exe
    sys.exit(f"no Python {' or '.join(candidates)} found")


def venv_has_torch(python, version):
    if not os.path.exists(python):
        return False
    probe = subprocess.run([python, "-c", "import numpy, torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip().split("+")[0] == version


def outer(args):
    venv = args.venv or f"/tmp/torch-{args.version}"
    out = os.path.abspath(args.out or os.path.join(ROOT, "test", "Inputs",
                                                   f"torch-{args.version}-ws2"))
    python = os.path.join(venv, "bin", "python")
    if not venv_has_torch(python, args.version):
        if not os.path.exists(python):
            subprocess.check_call([pick_python(args.python), "-m", "venv", venv])
        # torch.distributed's object collectives (which dcp.save uses) need numpy.
        major, minor = (int(x) for x in args.version.split(".")[:2])
        numpy = "numpy<2" if (major, minor) < (2, 3) else "numpy"
        subprocess.check_call([python, "-m", "pip", "install", f"torch=={args.version}", numpy])
    work = args.work or f"/tmp/torch-fixture-{args.version}"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    subprocess.check_call([python, os.path.abspath(__file__), "--generate", work], env=env)
    os.makedirs(out, exist_ok=True)
    shutil.rmtree(os.path.join(out, "checkpoint"), ignore_errors=True)
    shutil.copytree(os.path.join(work, "checkpoint"), os.path.join(out, "checkpoint"))
    for name in ["values.json", "model.json"]:
        shutil.copy(os.path.join(work, name), os.path.join(out, name))
    print(f"wrote {out} (pickletools listing of .metadata: {work}/metadata.dis.txt)")


# --- inside the venv ---------------------------------------------------------------

def build_model():
    import torch
    from torch import nn

    class Worked(nn.Module):
        def __init__(self):
            super().__init__()
            self.p0 = nn.Parameter(torch.randn(5, 3))
            self.p1 = nn.Parameter(torch.randn(7))
            self.p2 = nn.Parameter(torch.randn(4, 4))

        def forward(self, h):
            return h @ self.p2 + self.p0.square().mean() + self.p1.mean()

    class Frozen(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Parameter(torch.randn(5, 4).to(torch.bfloat16), requires_grad=False)
            self.gain = nn.Parameter(torch.randn(3).to(torch.bfloat16), requires_grad=False)

        def forward(self, h):
            return h * (1 + self.table.float().mean(0)) + self.gain.float().sum()

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.fc2 = nn.Linear(16, 4)
            self.worked = Worked()
            self.frozen = Frozen()

        def forward(self, x):
            return self.frozen(self.worked(self.fc2(torch.relu(self.fc1(x)))))

    return Model()


UNITS = ["fc1", "fc2", "worked", "frozen"]


def import_fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard  # 2.6 and later
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # 2.4, 2.5
    return fully_shard


def fsdp2_runs_on_cpu():
    """FSDP2's forward makes CUDA streams in 2.4 (it fails on a CPU-only
    machine); 2.8 and 2.15 run it on a CPU mesh (2.5-2.7 untried)."""
    import torch
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 5)


def train_on_replica(model, params, optim, rank):
    """The same two data-parallel steps without FSDP2's forward: an unsharded
    replica (same seed, so the same full parameters) computes the gradients,
    averaged over the ranks with all_reduce, which are then sharded like the
    parameters (Shard(0), torch.chunk sizes, as FSDP2 shards) and stepped by the
    real optimizer of the sharded model. The checkpoint path, get_state_dict
    and dcp.save on FSDP2's DTensors, is the same as after a real FSDP2 step."""
    import torch
    import torch.distributed as dist
    try:
        from torch.distributed.tensor import distribute_tensor
    except ImportError:
        from torch.distributed._tensor import distribute_tensor

    torch.manual_seed(0)
    replica = build_model()
    replica_params = [p for p in replica.parameters() if p.requires_grad]
    replica_optim = torch.optim.AdamW(replica_params, lr=LR, weight_decay=WEIGHT_DECAY)
    torch.manual_seed(1 + rank)  # different data on each rank
    for _ in range(2):
        loss = replica(torch.randn(3, 8)).square().mean()
        loss.backward()
        for p, full in zip(params, replica_params):
            dist.all_reduce(full.grad)
            full.grad /= WORLD_SIZE
            p.grad = distribute_tensor(full.grad, p.device_mesh, p.placements)
        optim.step()
        replica_optim.step()
        optim.zero_grad()
        replica_optim.zero_grad()
    for p, full in zip(model.parameters(), replica.parameters()):
        mine = full.detach().chunk(WORLD_SIZE)[rank]
        assert torch.equal(p.to_local(), mine), "the sharded model left its replica"


def worker(rank, work, port):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(0)  # the same full parameters on every rank
    model = build_model()
    fully_shard = import_fully_shard()
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    for name in UNITS:
        fully_shard(getattr(model, name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)
    if fsdp2_runs_on_cpu():
        torch.manual_seed(1 + rank)  # different data on each rank
        for _ in range(2):
            loss = model(torch.randn(3, 8)).square().mean()
            loss.backward()
            optim.step()
            optim.zero_grad()
    else:
        train_on_replica(model, params, optim, rank)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optimizer": osd,
             "extra": {"plain": torch.arange(6.0).reshape(2, 3), "note": "hello"}}
    dcp.save(state, checkpoint_id=os.path.join(work, "checkpoint"))
    dist.barrier()
    dist.destroy_process_group()


def dtype_name(dtype):
    return {"torch.float32": "f32", "torch.bfloat16": "bf16"}[str(dtype)]


def model_json(model):
    children = []
    for name in UNITS:
        module = getattr(model, name)
        params = []
        dtypes = set()
        for pname, p in module.named_parameters():
            entry = {"name": pname, "shape": list(p.shape), "dtype": dtype_name(p.dtype)}
            if not p.requires_grad:
                entry["requires_grad"] = False
            params.append(entry)
            dtypes.add(entry["dtype"])
        fully = {"placements": ["shard"]}
        if dtypes == {"bf16"}:
            fully["main_params_dtype"] = "bf16"
        children.append({"name": name, "fully_shard": fully, "params": params})
    return {
        "format": "fsdp-model-v1",
        "mesh": [{"name": "dp", "size": WORLD_SIZE}],
        "optimizer": {"kind": "adamw", "lr": LR, "betas": [0.9, 0.999], "eps": 1e-08,
                      "weight_decay": WEIGHT_DECAY, "state_dtype": "f32"},
        "module": {"name": "", "fully_shard": {"placements": ["shard"]}, "children": children},
    }


def describe(work):
    """What PyTorch reads back from the checkpoint, as values.json."""
    import pickle
    import pickletools
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    ckpt = os.path.join(work, "checkpoint")
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        raw = f.read()
    with open(os.path.join(work, "metadata.dis.txt"), "w") as f:
        pickletools.dis(raw, out=f)
    md = pickle.loads(raw)
    saved = os.path.join(work, "torch_save.pt")
    dcp_to_torch_save(ckpt, saved)
    state = torch.load(saved, weights_only=False)

    metadata, values = {}, {}
    for key, entry in md.state_dict_metadata.items():
        node = state
        for part in md.planner_data[key]:
            node = node[part]
        if isinstance(entry, BytesStorageMetadata):
            metadata[key] = {"bytes": True}
            values[key] = {"object": repr(node)}
            continue
        metadata[key] = {"shape": list(entry.size), "dtype": str(entry.properties.dtype),
                         "chunks": [[list(c.offsets), list(c.sizes)] for c in entry.chunks]}
        assert isinstance(node, torch.Tensor), key
        assert list(node.shape) == list(entry.size) and node.dtype == entry.properties.dtype, key
        values[key] = {"shape": list(node.shape), "dtype": str(node.dtype),
                       "values": node.detach().float().reshape(-1).tolist()}
    doc = {"world_size": WORLD_SIZE, "torch": torch.__version__, "metadata": metadata,
           "values": values, "files": sorted(os.listdir(ckpt))}
    with open(os.path.join(work, "values.json"), "w") as f:
        json.dump(doc, f)
    torch.manual_seed(0)
    with open(os.path.join(work, "model.json"), "w") as f:
        json.dump(model_json(build_model()), f, indent=1)
        f.write("\n")
    os.remove(saved)


def generate(work):
    import socket
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(work, port), nprocs=WORLD_SIZE, join=True)
    describe(work)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version", nargs="?", help="torch version, e.g. 2.15.0")
    parser.add_argument("--out", help="fixture directory (default test/Inputs/torch-VERSION-ws2)")
    parser.add_argument("--python", help="Python version for the venv, e.g. 3.12")
    parser.add_argument("--venv", help="venv directory (default /tmp/torch-VERSION)")
    parser.add_argument("--work", help="scratch directory (default /tmp/torch-fixture-VERSION)")
    parser.add_argument("--generate", metavar="WORK", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        generate(args.generate)
    elif args.version:
        outer(args)
    else:
        parser.error("give a torch version")


if __name__ == "__main__":
    main()
