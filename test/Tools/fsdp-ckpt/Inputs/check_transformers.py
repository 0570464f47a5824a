"""transformers' LlamaForCausalLM loads an export: no missing or unexpected keys,
the saved values, and the logits of the same weights loaded directly.

usage: check_transformers.py EXPORT_DIR MODEL_JSON SEED   (EXPORT_DIR holds config.json too)
"""
import sys

import torch
from export_common import expected, tied_sources
from transformers import LlamaConfig, LlamaForCausalLM

out_dir, model_json, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
model, info = LlamaForCausalLM.from_pretrained(out_dir, output_loading_info=True,
                                               torch_dtype=torch.float32)
for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
    assert not info.get(kind), (kind, info[kind])
config = LlamaConfig.from_pretrained(out_dir)
assert config.tie_word_embeddings
assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

# The same weights put straight into a model built from the config.
sources = tied_sources(model_json)
direct = LlamaForCausalLM(config).to(torch.float32)
state = {name: expected("model." + sources[name], list(p.shape), seed)
         for name, p in direct.state_dict().items() if name in sources}
missing, unexpected = direct.load_state_dict(state, strict=False)
assert not unexpected and all(k.endswith("rotary_emb.inv_freq") for k in missing), (missing, unexpected)
for name, p in model.state_dict().items():
    if name in state:
        assert torch.equal(p, state[name]), name
torch.manual_seed(0)
ids = torch.randint(0, config.vocab_size, (2, 16))
with torch.no_grad():
    a, b = model(ids).logits, direct(ids).logits
assert torch.equal(a, b), (a - b).abs().max()
print(f"transformers: {len(state)} weights loaded, no missing or unexpected keys, same logits")
