"""Test support: train a real model with Megatron-FSDP 0.6's `experimental` fully_shard on CPU.

Megatron-FSDP's experimental path (megatron_fsdp.experimental) is pure Python over torch
collectives; the only CUDA-only calls are in experimental/module.py: two torch.cuda.Stream per
root context (created under torch.cuda.device(dev)), torch.cuda.current_stream, stream
contexts, wait_stream / wait_event / record_event and torch.cuda.nvtx ranges. `install()`
(or the `cpu_standins()` context manager) replaces that module's `torch` global by a proxy
whose `cuda` is a set of no-op stand-ins (CPU work runs in program order, so every stream
wait is already satisfied); everything else is torch itself. Nothing in site-packages and
nothing of torch.cuda itself is changed. Gloo (this torch) has every collective the path
uses, AVG included: all_gather_into_tensor, reduce_scatter_tensor, all_reduce, in f32/bf16.

    build(world, hsdp=..., ...) -> (model, optimizer)   in an initialised gloo process group
    train_step(model, optimizer, step_index, world, rank, scheduler=None) -> local loss
    snapshot(model, optimizer) -> {name: CPU tensor or plain value}; differences(a, b)
    restore(model, optimizer, snap, sync=True): the snapshot written back in place
    selftest()  (python megatron_cpu.py [--all]): two separate spawns train the same steps
                and must give bit-identical snapshots.

Facts about 0.6.1 this relies on: gradients are reduced by the post-accumulate-grad hooks
fully_shard registers (nothing to call after backward; HSDP's dp_outer all-reduce happens on
the last microbatch, which is every backward unless `experimental.microbatch(model,
is_last=False)` says otherwise); fully_shard_optimizer's step post-hook refreshes the
model_weight of every group holding an optimizer parameter from its main_weight
(FsdpParameterGroup.sync_model_weight_from_main_weight, an in-place cast into the same
model_weight buffer); the forward all-gathers model_weight, never main_weight, so main
weights loaded in place need `sync_model_weights(model)` before the next forward (frozen bf16
groups are never refreshed by the optimizer at all).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import torch_packing as tp  # noqa: E402

# ---------------------------------------------------------------------------------------------
# CPU stand-ins for the CUDA-only calls of megatron_fsdp.experimental.module


class _Event:
    """torch.cuda.Event stand-in: CPU work is complete when it is issued."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass


class _Stream:
    """torch.cuda.Stream stand-in: one in-order CPU 'stream' (every wait is a no-op)."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event if event is not None else _Event()

    def query(self):
        return True

    def synchronize(self):
        pass


class _Nvtx:
    @staticmethod
    def range_push(msg):
        return 0

    @staticmethod
    def range_pop():
        return 0

    @staticmethod
    def mark(msg):
        pass

    @staticmethod
    @contextlib.contextmanager
    def range(msg, *args, **kwargs):
        yield


class _Cuda(types.SimpleNamespace):
    """The torch.cuda a Megatron-FSDP module sees on CPU: streams, events, device and stream
    contexts, nvtx are stand-ins; anything else is torch.cuda's own."""

    Stream = _Stream
    Event = _Event
    nvtx = _Nvtx

    @staticmethod
    def current_stream(device=None):
        return _Stream(device)

    @staticmethod
    def default_stream(device=None):
        return _Stream(device)

    @staticmethod
    def stream(stream):
        return contextlib.nullcontext()

    @staticmethod
    def device(device):
        return contextlib.nullcontext()

    @staticmethod
    def synchronize(device=None):
        pass

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


class _Torch(types.SimpleNamespace):
    """`torch` as a Megatron-FSDP module sees it: torch, with `cuda` replaced."""

    cuda = _Cuda()

    def __getattr__(self, name):
        return getattr(torch, name)


_PATCHED = ("megatron_fsdp.experimental.module",)
_saved: dict[str, object] = {}


def skip_module_unless_importable():
    """At a test module's top: skips the whole module where megatron_fsdp.experimental (or
    fsdp_mlir) does not import here (not installed, or needing what this machine lacks)."""
    import importlib
    import pytest
    pytest.importorskip("fsdp_mlir")
    try:
        importlib.import_module("megatron_fsdp.experimental")
    except Exception as e:
        pytest.skip(f"megatron-fsdp (experimental) is not importable here: {e}",
                    allow_module_level=True)


def install():
    """Make megatron_fsdp.experimental run on CPU in this process (idempotent). Only the
    `torch` global of megatron_fsdp.experimental.module is replaced; uninstall() restores it."""
    import importlib
    for name in _PATCHED:
        mod = importlib.import_module(name)
        if isinstance(mod.torch, _Torch):
            continue
        _saved[name] = mod.torch
        mod.torch = _Torch()


def uninstall():
    import importlib
    for name, orig in list(_saved.items()):
        importlib.import_module(name).torch = orig
        del _saved[name]


@contextlib.contextmanager
def cpu_standins():
    """install() for the duration of the block (forward/backward/step all need it), restoring
    what was there before unless it was already installed."""
    already = bool(_saved)
    install()
    try:
        yield
    finally:
        if not already:
            uninstall()


# ---------------------------------------------------------------------------------------------
# the model: tp.TinyLlama's parameters (same names and shapes), with a forward


HEADS, KV_HEADS = 4, 2


def _rms(x, weight):
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
    return x32.to(weight.dtype) * weight


def _rope(x, cos, sin):
    # x: (B, H, T, D), cos/sin: (T, D/2) in f32; rotate halves.
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)


class _RMSNorm(tp.RMSNorm):
    def forward(self, x):
        return _rms(x, self.weight)


class _Attention(tp.Attention):
    def forward(self, x, cos, sin, scale):
        b, t, hidden = x.shape
        hd = hidden // HEADS
        q = self.q_proj(x).view(b, t, HEADS, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, KV_HEADS, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, KV_HEADS, hd).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        q = q * scale  # (T, hd) frozen bf16 per-position scale
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        att = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(hd)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v.float()).to(x.dtype).transpose(1, 2).reshape(b, t, hidden)
        return self.o_proj(y)


class _MLP(tp.MLP):
    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(tp.Layer):
    def forward(self, x, cos, sin, scale):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, scale)
        return h + self.mlp(self.post_attention_layernorm(h))


class _Inner(tp.Inner):
    def forward(self, tokens):
        h = self.embed_tokens(tokens)
        t, hidden = tokens.shape[1], h.shape[-1]
        hd = hidden // HEADS
        pos = torch.arange(t)
        inv_freq = self.rotary_emb.inv_freq[: hd // 2].float()
        freqs = torch.outer(pos.float(), inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        scale = self.pos_scale[pos % self.pos_scale.shape[0]][:, :hd].to(h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin, scale)
        return self.norm(h)


class CpuLlama(tp.TinyLlama):
    """tp.TinyLlama (the same parameter names, shapes, dtypes, tying) with a Llama forward:
    tokens (B, T) int64 -> logits (B, T, vocab) bf16. frozen=True keeps its two frozen
    parameters (model.rotary_emb.inv_freq f32, model.pos_scale bf16: two frozen groups of the
    root unit); frozen=False makes them buffers (not parameters, not sharded)."""

    def __init__(self, *, tied=False, frozen=True, **kw):
        super().__init__(tied=tied, **kw)
        swap = {tp.Layer: _Layer, tp.Attention: _Attention, tp.MLP: _MLP, tp.RMSNorm: _RMSNorm,
                tp.Inner: _Inner}
        for m in self.modules():
            if type(m) in swap:
                m.__class__ = swap[type(m)]
        if not frozen:
            for mod, name in ((self.model.rotary_emb, "inv_freq"), (self.model, "pos_scale")):
                value = mod._parameters.pop(name).detach()
                mod.register_buffer(name, value)

    def forward(self, tokens):
        return self.lm_head(self.model(tokens))


# ---------------------------------------------------------------------------------------------
# building


def _zero_padding(dbuffer):
    """Zero the elements of a DBuffer's local buffer no logical tensor owns (layout gaps and
    padding, left uninitialised by Megatron-FSDP), so whole local buffers compare bitwise."""
    if dbuffer is None:
        return
    buf = dbuffer.local_buffer
    keep = torch.zeros(buf.numel(), dtype=torch.bool)
    for i in range(len(dbuffer.layout.tensor_shapes)):
        r = dbuffer._get_owned_range(i)
        if r is not None:
            keep[r.buffer_relative_offset: r.buffer_relative_offset + r.numel] = True
    with torch.no_grad():
        buf.masked_fill_(~keep, 0)


def mesh_and_placements(world, hsdp=False):
    """(DeviceMesh, Placements). FSDP: 1-D ("dp",), all Flat. HSDP: 2-D ("dp_outer",
    "dp_shard") of (2, world // 2) (or hsdp=(outer, shard)): parameter and optimizer
    [Replicate, Flat], gradient [Partial(AVG), Flat] (main_grad rests DP-outer-partial and is
    all-reduced over dp_outer on the last microbatch; Partial(SUM) would double it and the
    Replicate -> Partial relabel of the next step supports AVG only)."""
    import torch.distributed as dist
    from megatron_fsdp.experimental import Flat, Partial, Placements, Replicate
    from torch.distributed.device_mesh import init_device_mesh
    if hsdp:
        outer, shard = hsdp if isinstance(hsdp, tuple) else (2, world // 2)
        assert outer * shard == world, (hsdp, world)
        mesh = init_device_mesh("cpu", (outer, shard), mesh_dim_names=("dp_outer", "dp_shard"))
        placements = Placements(dp_axes=["dp_outer", "dp_shard"],
                                parameter=[Replicate(), Flat()],
                                gradient=[Partial(dist.ReduceOp.AVG), Flat()],
                                optimizer=[Replicate(), Flat()])
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        placements = Placements(dp_axes=["dp"], parameter=[Flat()], gradient=[Flat()],
                                optimizer=[Flat()])
    return mesh, placements


def build(world, *, hsdp=False, tied=False, two_groups=False, optimizer="adamw", lr=1e-2,
          amsgrad=False, frozen=True, seed=0, weight_decay=0.01, model_kw=None):
    """(model, optimizer) in this rank's initialised gloo process group of `world` ranks.

    CpuLlama (tp.TinyLlama shapes: vocab 96, hidden 24, kv 12, inter 40, 2 layers, bf16;
    seeded by `seed`, the same values on every rank), each model.layers.N fully_shard-ed, then
    the root, with MixedPrecisionPolicy(main_params_dtype=float32,
    main_grads_dtype=bfloat16); the optimizer over the trainable (sharded DTensor)
    parameters, then fully_shard_optimizer(opt). optimizer: "adamw" (weight_decay, amsgrad) or
    "sgd" (SGD momentum 0.9, weight_decay); two_groups: weight decay 0.1 for >= 2-D weights,
    0.0 for the rest. Padding of every buffer is zeroed (see _zero_padding).

    tied=True (lm_head.weight tied to model.embed_tokens.weight) raises NotImplementedError
    (TIED says why: 0.6.1 accepts it silently but packs the tensor twice and never reduces or
    updates the root unit); tied="force" builds it anyway, for tests of that behaviour."""
    if tied is True:
        raise NotImplementedError(TIED)
    from megatron_fsdp import MixedPrecisionPolicy
    from megatron_fsdp.experimental import fully_shard, fully_shard_optimizer
    install()
    mesh, placements = mesh_and_placements(world, hsdp)
    policy = MixedPrecisionPolicy(main_params_dtype=torch.float32,
                                  main_grads_dtype=torch.bfloat16)
    torch.manual_seed(seed)
    model = CpuLlama(tied=bool(tied), frozen=frozen, **(model_kw or {}))
    for layer in model.model.layers:
        fully_shard(layer, mesh, placements, policy)
    fully_shard(model, mesh, placements, policy)
    for g in parameter_groups(model):
        _zero_padding(g.main_weight)
        if g.model_weight is not g.main_weight:
            _zero_padding(g.model_weight)
        _zero_padding(g.main_grad)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if two_groups:
        params = [
            {"params": [p for _, p in named if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for _, p in named if p.ndim < 2], "weight_decay": 0.0},
        ]
    else:
        params = [p for _, p in named]
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    elif optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, amsgrad=amsgrad, weight_decay=weight_decay)
    else:
        raise ValueError(f"optimizer {optimizer!r}: 'adamw' or 'sgd'")
    fully_shard_optimizer(opt)
    return model, opt


TIED = ("Megatron-FSDP 0.6.1 experimental does not support tied weights: "
        "_collect_owned_parameters records the one Parameter under both names, so the root "
        "group packs it twice (two main_weight slots, two distinct sharded parameters: the "
        "tie is broken at rest; while unsharded both names use the one Parameter, whose .data "
        "is the last name's slot) and registers two post-accumulate-grad hooks on it; "
        "_ready_grad_parameters is a set, so it never reaches _num_trainable_parameters: the "
        "root unit's post_backward never runs (no reduce-scatter, no sharded .grad, so the "
        "optimizer skips the root's parameters, and the unsharded parameters stay installed "
        "after backward).")


# ---------------------------------------------------------------------------------------------
# introspection


def fsdp_units(model):
    """[(fqn, FsdpModule)] of every fully_shard-ed module, in named_modules order ('' root)."""
    from megatron_fsdp.experimental.module import FsdpModule
    return [(n, m) for n, m in model.named_modules() if isinstance(m, FsdpModule)]


def parameter_groups(model):
    return [g for _, m in fsdp_units(model) for g in m.parameter_groups]


def unit_info(model):
    """What a fully_shard-ed model says about itself, per unit (nothing else is stored: the
    FsdpModule keeps neither mesh, Placements nor MixedPrecisionPolicy; its groups do):
    [{"unit": fqn, "groups": [{"names", "dtype", "requires_grad", "mesh": {axis: size},
      "parameter" (model_weight placements), "optimizer" (main_weight placements),
      "gradient" (main_grad's accumulation placements, None for a frozen group),
      "main_params_dtype", "main_grads_dtype" (None for a frozen group),
      "model_weight_is_main_weight"}]}]."""
    out = []
    for unit, m in fsdp_units(model):
        groups = []
        for g in m.parameter_groups:
            groups.append({
                "names": list(g.parameter_names), "dtype": g.dtype,
                "requires_grad": g.requires_grad,
                "mesh": dict(zip(g.mesh.mesh_dim_names, g.mesh.shape)),
                "parameter": g.model_weight.placements, "optimizer": g.main_weight.placements,
                "gradient": getattr(g, "_accumulation_placements", None),
                "main_params_dtype": g.main_weight.dtype,
                "main_grads_dtype": g.main_grad.dtype if g.main_grad is not None else None,
                "model_weight_is_main_weight": g.model_weight is g.main_weight,
            })
        out.append({"unit": unit, "groups": groups})
    return out


def sync_model_weights(model):
    """Refresh every group's model_weight from its main_weight, as fully_shard_optimizer's step
    post-hook does (in place: model_weight.local_buffer.copy_(main_weight.local_buffer) when
    the placements agree). Call after writing main weights (param._local_tensor) directly."""
    with torch.no_grad():
        for g in parameter_groups(model):
            g.sync_model_weight_from_main_weight()


# ---------------------------------------------------------------------------------------------
# training


BATCH, SEQ = 2, 8


def batch(step_index, rank, vocab, batch_size=BATCH, seq=SEQ):
    """(inputs, targets) int64 (batch_size, seq): this rank's batch of step `step_index`."""
    g = torch.Generator().manual_seed(1_000_003 * (step_index + 1) + 7919 * rank)
    tokens = torch.randint(0, vocab, (batch_size, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def train_step(model, optimizer, step_index, world, rank, scheduler=None):
    """One optimizer step on this rank's deterministic batch; returns this rank's loss.

    Megatron-FSDP 0.6.1 needs nothing between backward and step: each unit's gradients are
    reduce-scattered (AVG) into its main_grad by post-accumulate-grad hooks (and, for HSDP,
    all-reduced over dp_outer since every microbatch is the last by default), and the sharded
    parameters' .grad are installed as DTensor views of main_grad (bf16). The optimizer's
    pre-hook casts them to f32 for the step; its post-hook restores them and casts main_weight
    into model_weight. zero_grad (set_to_none) clears the sharded .grad."""
    del world
    install()
    vocab = model.model.embed_tokens.num_embeddings
    inputs, targets = batch(step_index, rank, vocab)
    logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                             targets.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if scheduler is not None:
        scheduler.step()
    return loss.item()


# ---------------------------------------------------------------------------------------------
# snapshots


def _local(t):
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        t = t._local_tensor
    return t.detach().to("cpu", copy=True)


def snapshot(model, optimizer):
    """Every local tensor a resume needs, cloned to CPU:
      main_weight/<fqn>          param._local_tensor (f32 main-weight shard) of every parameter
                                 (frozen ones included)
      model_weight/<unit>/<i>    unit.parameter_groups[i].model_weight.local_buffer (bf16 for
                                 bf16 groups; a f32 frozen group's model_weight IS its main
                                 weight) -- whole local buffer, padding zeroed by build()
      state/<fqn>/<key>          optimizer.state[param][key] (DTensor -> its local tensor;
                                 step is a plain 0-d f32 tensor)
      param_groups               [group minus 'params'] + 'param_names' (fqns)
    """
    names = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(p, n)
    out = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        out[f"main_weight/{n}"] = _local(p)
    for unit, m in fsdp_units(model):
        for i, g in enumerate(m.parameter_groups):
            mw = g.model_weight.local_buffer
            out[f"model_weight/{unit or '<root>'}/{i}"] = mw.detach().clone()
    for p, st in optimizer.state.items():
        for k, v in st.items():
            out[f"state/{names[p]}/{k}"] = _local(v) if torch.is_tensor(v) else v
    groups = []
    for g in optimizer.param_groups:
        d = {k: v for k, v in g.items() if k != "params"}
        d["param_names"] = [names[p] for p in g["params"]]
        groups.append(d)
    out["param_groups"] = groups
    return out


def restore(model, optimizer, snap, *, sync=True):
    """Write a snapshot back in place: every main-weight shard (param._local_tensor.copy_),
    every optimizer state tensor (into the existing ones; missing state is created as torch
    would, DTensors over the parameter's mesh and placements), the param_groups' values
    (params kept); then, with sync, model_weight from main_weight (sync_model_weights). The
    snapshot's model_weight entries are not written: they are the cast of the main weights."""
    from torch.distributed.tensor import DTensor
    params = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for n, p in params.items():
            p._local_tensor.copy_(snap[f"main_weight/{n}"])
        names = {}
        for n, p in params.items():
            names.setdefault(p, n)
        for pg in optimizer.param_groups:
            for p in pg["params"]:
                prefix = f"state/{names[p]}/"
                saved = {k[len(prefix):]: v for k, v in snap.items() if k.startswith(prefix)}
                if not saved:
                    continue
                st = optimizer.state[p]
                for k, v in saved.items():
                    cur = st.get(k)
                    if isinstance(cur, DTensor):
                        cur._local_tensor.copy_(v)
                    elif torch.is_tensor(cur):
                        cur.copy_(v)
                    elif not torch.is_tensor(v):
                        st[k] = v
                    elif (k != "step" and isinstance(p, DTensor)
                          and v.shape == p._local_tensor.shape):
                        st[k] = DTensor.from_local(v.clone(), p.device_mesh, p.placements,
                                                   run_check=False, shape=p.shape,
                                                   stride=p.stride())
                    else:
                        st[k] = v.clone()
    for pg, saved in zip(optimizer.param_groups, snap["param_groups"], strict=True):
        assert [names[p] for p in pg["params"]] == saved["param_names"]
        for k, v in saved.items():
            if k != "param_names":
                pg[k] = v
    if sync:
        sync_model_weights(model)


def _same(a, b):
    if torch.is_tensor(a) and torch.is_tensor(b):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.numel() == 0:
            return True
        return torch.equal(a.contiguous().view(-1).view(torch.uint8),
                           b.contiguous().view(-1).view(torch.uint8))
    if torch.is_tensor(a) or torch.is_tensor(b):
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def differences(a, b):
    """Keys whose values differ bitwise (or that only one snapshot has), sorted."""
    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or not _same(a[k], b[k]))


# ---------------------------------------------------------------------------------------------
# self-check


def _selftest_worker(rank, world, port, config, steps, path, scheduler):
    model, opt = build(world, **config)
    sched = None
    if scheduler:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    losses = [train_step(model, opt, s, world, rank, sched) for s in range(steps)]
    snap = snapshot(model, opt)
    snap["losses"] = losses
    torch.save(snap, f"{path}.{rank}")


def run_config(world, config, steps, path, scheduler=True):
    """Spawn `world` ranks that build(world, **config), train `steps` steps (with a LambdaLR
    1 / (1 + step) scheduler unless scheduler=False) and save their snapshots (with 'losses')
    to path.<rank>; returns the list of snapshots."""
    tp.spawn(_selftest_worker, world, config, steps, path, scheduler)
    return [torch.load(f"{path}.{r}", weights_only=False) for r in range(world)]


CONFIGS = [
    (2, {}),
    (4, {}),
    (4, {"hsdp": True}),
    (2, {"two_groups": True}),
    (4, {"hsdp": True, "two_groups": True, "amsgrad": True}),
    (2, {"optimizer": "sgd"}),
    (2, {"frozen": False}),
]


def selftest(configs=((2, {}),), steps=3):
    """Each config trained twice from scratch in separate spawns: snapshots bit-identical,
    losses finite and (summed over ranks) decreasing from the first step."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for ci, (world, config) in enumerate(configs):
            a = run_config(world, config, steps, os.path.join(d, f"{ci}a"))
            b = run_config(world, config, steps, os.path.join(d, f"{ci}b"))
            for r in range(world):
                diff = differences(a[r], b[r])
                assert not diff, f"world {world} {config} rank {r}: runs differ in {diff[:8]}"
            losses = [sum(s["losses"][i] for s in a) / world for i in range(steps)]
            assert all(math.isfinite(x) for x in losses), losses
            assert losses[-1] < losses[0], losses
            print(f"world {world} {config or ''}: {len(a[0])} snapshot entries per rank, "
                  f"bit-identical twice; mean losses {['%.6f' % x for x in losses]}",
                  flush=True)


if __name__ == "__main__":
    selftest(CONFIGS if "--all" in sys.argv else ((2, {}),),
             steps=int(os.environ.get("MCPU_STEPS", "3")))
