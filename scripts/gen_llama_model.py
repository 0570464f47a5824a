#!/usr/bin/env python3
"""Write an fsdp-model-v1 description (docs/ModelDescription.md) of a Llama model.

The module tree follows Hugging Face ``LlamaForCausalLM``:

    model.embed_tokens.weight                     [vocab, hidden]
    model.layers.<i>.self_attn.q_proj.weight      [heads * head_dim, hidden]
    model.layers.<i>.self_attn.k_proj.weight      [kv_heads * head_dim, hidden]
    model.layers.<i>.self_attn.v_proj.weight      [kv_heads * head_dim, hidden]
    model.layers.<i>.self_attn.o_proj.weight      [hidden, heads * head_dim]
    model.layers.<i>.mlp.gate_proj.weight         [intermediate, hidden]
    model.layers.<i>.mlp.up_proj.weight           [intermediate, hidden]
    model.layers.<i>.mlp.down_proj.weight         [hidden, intermediate]
    model.layers.<i>.input_layernorm.weight       [hidden]
    model.layers.<i>.post_attention_layernorm.weight [hidden]
    model.norm.weight                             [hidden]
    lm_head.weight                                [vocab, hidden]  (tied_to the embedding if tied)

(plus ``.bias`` parameters when the config sets ``attention_bias`` or ``mlp_bias``).
Every decoder layer ``model.layers.<i>`` is a ``fully_shard`` unit; the root is one too and owns
the embedding, the final norm and the head.

Examples:
    gen_llama_model.py --preset 8b -o llama3-8b.json
    gen_llama_model.py --config config.json --mesh dp_outer=2,dp_shard=4 \\
        --placements replicate,shard
    gen_llama_model.py --preset tiny --mesh dp=4 --layers 2

Standard library only; the output is deterministic (same arguments, same bytes).
"""

import argparse
import json
import re
import sys

FORMAT = "fsdp-model-v1"

# Architecture numbers of the released checkpoints (their Hugging Face config.json).
PRESETS = {
    # A small model for runtime tests (~5.0M parameters).
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    # meta-llama/Llama-3.2-1B
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    # meta-llama/Meta-Llama-3-8B
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    # meta-llama/Meta-Llama-3-70B
    "70b": {
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    # meta-llama/Llama-3.1-405B
    "405b": {
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}

# dtype names of section 4.2 that make sense for Llama weights, and the PyTorch spellings.
DTYPES = {
    "f64": "f64", "float64": "f64", "double": "f64",
    "f32": "f32", "float32": "f32", "float": "f32",
    "bf16": "bf16", "bfloat16": "bf16",
    "f16": "f16", "float16": "f16", "half": "f16",
}

PLACEMENTS = ("shard", "replicate")
MESH_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# PyTorch defaults, spelled out.
OPTIMIZERS = {
    "adamw": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
    "adam": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
}


class GenError(Exception):
    pass


def dtype_name(value, what):
    if not isinstance(value, str) or value.lower().removeprefix("torch.") not in DTYPES:
        raise GenError(
            "%s: unsupported dtype %r (expected one of f64, f32, bf16, f16 or a PyTorch name "
            "such as bfloat16)" % (what, value))
    return DTYPES[value.lower().removeprefix("torch.")]


def parse_mesh(text):
    mesh = []
    seen = set()
    for item in text.split(","):
        name, sep, size = item.strip().partition("=")
        name = name.strip()
        size = size.strip()
        if not sep or not name or not size:
            raise GenError("--mesh: %r is not NAME=SIZE" % item)
        if not MESH_NAME.match(name):
            raise GenError("--mesh: axis name %r is not an identifier" % name)
        if name in seen:
            raise GenError("--mesh: axis %r appears twice" % name)
        if not size.isdigit() or int(size) < 1:
            raise GenError("--mesh: size of axis %r must be a positive integer, got %r"
                           % (name, size))
        seen.add(name)
        mesh.append({"name": name, "size": int(size)})
    return mesh


def parse_placements(text, mesh):
    if text is None:
        placements = ["shard"] * len(mesh)
    else:
        placements = [p.strip() for p in text.split(",")]
    for p in placements:
        if p not in PLACEMENTS:
            raise GenError("--placements: %r is neither 'shard' nor 'replicate'" % p)
    if len(placements) != len(mesh):
        raise GenError("--placements: %d placement(s) for a mesh of %d axis/axes (%s)"
                       % (len(placements), len(mesh),
                          ",".join("%s=%d" % (a["name"], a["size"]) for a in mesh)))
    first_shard = placements.index("shard") if "shard" in placements else len(placements)
    if "replicate" in placements[first_shard:]:
        raise GenError("--placements: the shard axes must form a suffix (got %s)"
                       % ",".join(placements))
    return placements


def load_config(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            config = json.load(f)
    except OSError as e:
        raise GenError("%s: cannot read: %s" % (path, e.strerror or e))
    except json.JSONDecodeError as e:
        raise GenError("%s:%d:%d: invalid JSON: %s" % (path, e.lineno, e.colno, e.msg))
    if not isinstance(config, dict):
        raise GenError("%s: expected a JSON object (a Hugging Face config.json)" % path)
    # Some configs nest the language model (e.g. multimodal wrappers).
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    model_type = config.get("model_type")
    if model_type is not None and model_type != "llama":
        print("gen_llama_model.py: warning: %s: model_type is %r, not 'llama'; writing the "
              "Llama module tree anyway" % (path, model_type), file=sys.stderr)
    return config


def positive_int(config, key, source, required=True):
    if key not in config or config[key] is None:
        if required:
            raise GenError("%s: missing %r" % (source, key))
        return None
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GenError("%s: %r must be a positive integer, got %r" % (source, key, value))
    return value


def flag(config, key, source, default=False):
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise GenError("%s: %r must be true or false, got %r" % (source, key, value))
    return value


def resolve_dims(config, source, args):
    """Validated architecture numbers, after the command-line overrides."""
    c = dict(config)
    if (args.hidden is not None or args.heads is not None) and args.head_dim is None:
        # A narrowed model: derive head_dim from the new numbers, not the config's.
        c.pop("head_dim", None)
    overrides = (("hidden_size", args.hidden), ("intermediate_size", args.intermediate),
                 ("num_hidden_layers", args.layers), ("vocab_size", args.vocab),
                 ("num_attention_heads", args.heads), ("num_key_value_heads", args.kv_heads),
                 ("head_dim", args.head_dim))
    for key, value in overrides:
        if value is not None:
            c[key] = value
    if args.tie_word_embeddings is not None:
        c["tie_word_embeddings"] = args.tie_word_embeddings

    d = {}
    d["hidden"] = positive_int(c, "hidden_size", source)
    d["intermediate"] = positive_int(c, "intermediate_size", source)
    d["layers"] = positive_int(c, "num_hidden_layers", source)
    d["heads"] = positive_int(c, "num_attention_heads", source)
    d["vocab"] = positive_int(c, "vocab_size", source)
    kv = positive_int(c, "num_key_value_heads", source, required=False)
    d["kv_heads"] = d["heads"] if kv is None else kv
    head_dim = positive_int(c, "head_dim", source, required=False)
    if head_dim is None:
        if d["hidden"] % d["heads"] != 0:
            raise GenError("%s: hidden_size %d is not divisible by num_attention_heads %d "
                           "(give head_dim explicitly)" % (source, d["hidden"], d["heads"]))
        head_dim = d["hidden"] // d["heads"]
    d["head_dim"] = head_dim
    if d["heads"] % d["kv_heads"] != 0:
        raise GenError("%s: num_attention_heads %d is not divisible by num_key_value_heads %d"
                       % (source, d["heads"], d["kv_heads"]))
    d["tied"] = flag(c, "tie_word_embeddings", source)
    d["attention_bias"] = flag(c, "attention_bias", source)
    d["mlp_bias"] = flag(c, "mlp_bias", source)

    if args.dtype is not None:
        d["dtype"] = dtype_name(args.dtype, "--dtype")
    else:
        cfg_dtype = c.get("torch_dtype", c.get("dtype"))
        d["dtype"] = "bf16" if cfg_dtype is None else dtype_name(cfg_dtype, source + ": torch_dtype")
    return d


def param(name, shape, dtype, tied_to=None):
    p = {"name": name, "shape": list(shape), "dtype": dtype, "requires_grad": True}
    if tied_to is not None:
        p["tied_to"] = tied_to
    return p


def module(name, params=None, children=None, fully_shard=None):
    m = {"name": name}
    if fully_shard is not None:
        m["fully_shard"] = fully_shard
    if params:
        m["params"] = params
    if children:
        m["children"] = children
    return m


def linear(name, out_features, in_features, dtype, bias):
    params = [param("weight", [out_features, in_features], dtype)]
    if bias:
        params.append(param("bias", [out_features], dtype))
    return module(name, params=params)


def build_model(d, mesh, placements, main_params_dtype, main_grads_dtype, optimizer):
    dt = d["dtype"]
    h = d["hidden"]
    q_out = d["heads"] * d["head_dim"]
    kv_out = d["kv_heads"] * d["head_dim"]

    def unit():
        fs = {"placements": list(placements), "main_params_dtype": main_params_dtype}
        if main_grads_dtype is not None:
            fs["main_grads_dtype"] = main_grads_dtype
        return fs

    layers = []
    for i in range(d["layers"]):
        ab, mb = d["attention_bias"], d["mlp_bias"]
        layers.append(module(str(i), fully_shard=unit(), children=[
            module("self_attn", children=[
                linear("q_proj", q_out, h, dt, ab),
                linear("k_proj", kv_out, h, dt, ab),
                linear("v_proj", kv_out, h, dt, ab),
                linear("o_proj", h, q_out, dt, ab),
            ]),
            module("mlp", children=[
                linear("gate_proj", d["intermediate"], h, dt, mb),
                linear("up_proj", d["intermediate"], h, dt, mb),
                linear("down_proj", h, d["intermediate"], dt, mb),
            ]),
            module("input_layernorm", params=[param("weight", [h], dt)]),
            module("post_attention_layernorm", params=[param("weight", [h], dt)]),
        ]))

    root = module("", fully_shard=unit(), children=[
        module("model", children=[
            module("embed_tokens", params=[param("weight", [d["vocab"], h], dt)]),
            {"name": "layers", "children": layers},
            module("norm", params=[param("weight", [h], dt)]),
        ]),
        module("lm_head", params=[
            param("weight", [d["vocab"], h], dt,
                  tied_to="model.embed_tokens.weight" if d["tied"] else None)]),
    ])

    opt = {"kind": optimizer}
    opt.update(OPTIMIZERS[optimizer])
    opt["state_dtype"] = "f32"
    return {"format": FORMAT, "mesh": mesh, "optimizer": opt, "module": root}


def count_params(module_json, prefix=""):
    """Number of distinct parameter elements (a tied parameter counts once)."""
    total = 0
    for p in module_json.get("params", []):
        if "tied_to" in p:
            continue
        n = 1
        for s in p["shape"]:
            n *= s
        total += n
    for c in module_json.get("children", []):
        total += count_params(c)
    return total


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="gen_llama_model.py",
        description="Write an fsdp-model-v1 JSON description of a Llama (LlamaForCausalLM) "
                    "model from a Hugging Face config.json or a preset.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="presets: " + ", ".join(
            "%s (hidden %d, %d layers)" % (k, v["hidden_size"], v["num_hidden_layers"])
            for k, v in PRESETS.items()))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", metavar="FILE",
                     help="Hugging Face style config.json (hidden_size, intermediate_size, ...)")
    src.add_argument("--preset", choices=list(PRESETS), help="built-in Llama-3.x shape")
    ap.add_argument("--mesh", default="dp=8", metavar="NAME=SIZE[,NAME=SIZE...]",
                    help="data-parallel mesh, axis 0 first (default: dp=8)")
    ap.add_argument("--placements", metavar="shard|replicate[,...]",
                    help="one per mesh axis, shard axes a suffix (default: all shard)")
    ap.add_argument("--dtype", help="parameter dtype (default: the config's torch_dtype, else bf16)")
    ap.add_argument("--main-params-dtype", default="f32", help="main weight dtype (default: f32)")
    ap.add_argument("--main-grads-dtype",
                    help="main gradient dtype (default: omitted, i.e. the parameter dtype)")
    ap.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw",
                    help="optimizer kind, PyTorch default hyper-parameters (default: adamw)")
    ap.add_argument("--layers", type=int, metavar="N", help="override num_hidden_layers")
    ap.add_argument("--hidden", type=int, metavar="N",
                    help="override hidden_size (head_dim then becomes hidden/heads unless "
                         "--head-dim is given)")
    ap.add_argument("--intermediate", type=int, metavar="N", help="override intermediate_size")
    ap.add_argument("--vocab", type=int, metavar="N", help="override vocab_size")
    ap.add_argument("--heads", type=int, metavar="N",
                    help="override num_attention_heads (head_dim as for --hidden)")
    ap.add_argument("--kv-heads", type=int, metavar="N", help="override num_key_value_heads")
    ap.add_argument("--head-dim", type=int, metavar="N", help="override head_dim")
    ap.add_argument("--tie-word-embeddings", action=argparse.BooleanOptionalAction, default=None,
                    help="override tie_word_embeddings")
    ap.add_argument("--print-count", action="store_true",
                    help="print the parameter count to stderr")
    ap.add_argument("-o", "--output", metavar="OUT", help="output file (default: stdout)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.config is not None:
            config, source = load_config(args.config), args.config
        else:
            config, source = PRESETS[args.preset], "preset " + args.preset
        for opt, value in (("--layers", args.layers), ("--hidden", args.hidden),
                           ("--intermediate", args.intermediate), ("--vocab", args.vocab),
                           ("--heads", args.heads), ("--kv-heads", args.kv_heads),
                           ("--head-dim", args.head_dim)):
            if value is not None and value < 1:
                raise GenError("%s must be a positive integer, got %d" % (opt, value))
        dims = resolve_dims(config, source, args)
        mesh = parse_mesh(args.mesh)
        placements = parse_placements(args.placements, mesh)
        main_params = dtype_name(args.main_params_dtype, "--main-params-dtype")
        main_grads = (None if args.main_grads_dtype is None
                      else dtype_name(args.main_grads_dtype, "--main-grads-dtype"))
        model = build_model(dims, mesh, placements, main_params, main_grads, args.optimizer)
    except GenError as e:
        print("gen_llama_model.py: error: %s" % e, file=sys.stderr)
        return 2

    text = json.dumps(model, indent=1) + "\n"
    if args.output is None or args.output == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(args.output, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
        except OSError as e:
            print("gen_llama_model.py: error: %s: cannot write: %s"
                  % (args.output, e.strerror or e), file=sys.stderr)
            return 1
    if args.print_count:
        print("%s: %d parameters" % (source, count_params(model["module"])), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
