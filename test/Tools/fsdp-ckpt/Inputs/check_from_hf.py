"""The Hugging Face side of from-hf-transformers.test, with pip-installed transformers,
safetensors and torch (real clients, none of our code):

  check_from_hf.py write DIR        a LlamaForCausalLM of DIR/config.json (random weights,
                                    seeded), saved by save_pretrained in bf16 as shards of
                                    40KB and their index
  check_from_hf.py check HF CKPT    CKPT, read by torch.distributed.checkpoint, holds every
                                    tensor of HF's files cast to f32 (tied lm_head.weight: the
                                    embedding), zero optimizer state and step 0
"""
import glob
import os
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file


def write(out):
    import transformers
    config = transformers.AutoConfig.from_pretrained(out)
    torch.manual_seed(1234)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="40KB")
    files = glob.glob(os.path.join(out, "*.safetensors"))
    print(f"wrote {len(files)} safetensors files")


def check(hf, ckpt):
    tensors = {}
    for path in sorted(glob.glob(os.path.join(hf, "*.safetensors"))):
        tensors.update(load_file(path))
    reader = dcp.FileSystemReader(ckpt)
    metadata = reader.read_metadata()
    state = {}
    for key, md in metadata.state_dict_metadata.items():
        if hasattr(md, "size"):
            state[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader)
    models = {k[6:]: v for k, v in state.items() if k.startswith("model.")}
    tied = 0
    for name in models:
        source = tensors.get(name)
        if source is None and name == "lm_head.weight":
            source, tied = tensors["model.embed_tokens.weight"], 1
        assert source is not None, f"{name}: not in the Hugging Face files"
        want = source.to(torch.float32)
        got = models[name]
        assert got.dtype == torch.float32 and got.shape == want.shape, (name, got.shape)
        assert torch.equal(got, want), f"{name}: {int((got != want).sum())} values differ"
    missing = set(tensors) - set(models)
    assert not missing, f"not loaded: {sorted(missing)}"
    others = {k: v for k, v in state.items() if k.startswith("optimizer.state.")}
    for key, value in others.items():
        assert not bool(value.any()), f"{key}: not zero"
    steps = [k for k in others if k.endswith(".step")]
    print(f"{len(models)} model tensors equal to the files' (cast to f32, {tied} tied), "
          f"{len(others)} optimizer tensors zero ({len(steps)} steps)")


if __name__ == "__main__":
    {"write": lambda: write(sys.argv[2]), "check": lambda: check(sys.argv[2], sys.argv[3])}[
        sys.argv[1]]()
