"""A small Llama config.json with tied embeddings (no hub access): usage: write_llama_config.py DIR"""
import json
import os
import sys

config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 320, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
}
os.makedirs(sys.argv[1], exist_ok=True)
json.dump(config, open(os.path.join(sys.argv[1], "config.json"), "w"), indent=1)
