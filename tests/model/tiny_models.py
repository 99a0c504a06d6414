"""Tiny random models for the model-layer tests: HF Llama/Qwen2 variants and a tiny GGUF."""

from __future__ import annotations

import numpy as np
import torch

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

# name -> (model_type, config overrides). Together they cover tied and untied heads, q/k/v
# bias (Qwen2), o_proj bias (Llama attention_bias), the three rope types, and an uneven
# tensor-parallel split (3 kv heads, an odd intermediate size).
TINY_VARIANTS = {
    "llama": ("llama", {}),
    "llama-tied-llama3-rope": ("llama", dict(tie_word_embeddings=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
    "llama-linear-rope-attention-bias": ("llama", dict(attention_bias=True, rope_parameters=dict(
        rope_type="linear", rope_theta=10000.0, factor=2.0))),
    "qwen2": ("qwen2", {}),
    "qwen2-3kv-odd-mlp": ("qwen2", dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3,
                                       intermediate_size=131)),
}


def make_tiny_hf_model(variant: str, seed: int = 0):
    """A random HF model of `variant` in float32; every weight, bias and norm perturbed,
    so no parameter keeps HF's zero/one initialisation."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    model_type, overrides = TINY_VARIANTS[variant]
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[model_type]
    config = config_class(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.5 if "embed_tokens" in name else 0.1)
    return model


def write_tiny_gguf(path: str, seed: int = 0) -> None:
    """A 2-layer Llama GGUF (Q8_0 linear weights, F32 rest) with a byte-level BPE tokenizer:
    enough for transformers to dequantize it in about a second."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    byte_chars = bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [byte_chars[b] for b in range(256)] + ["he", "ll"]
    hidden, heads, kv_heads, inter, layers = 64, 4, 2, 128, 2
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * 3 + [1] * (len(tokens) - 3))
    writer.add_token_merges(["h e", "l l"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(1)  # wrong on purpose, as SmolLM2's converted tokenizer once was
    writer.add_pad_token_id(2)

    def tensor(name, *shape, quantize=False, norm=False):
        values = (1 + 0.1 * rng.standard_normal(shape)) if norm else 0.1 * rng.standard_normal(shape)
        values = values.astype(np.float32)
        if quantize:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(values, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, values)

    tensor("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", hidden, norm=True)
        tensor(f"blk.{i}.attn_q.weight", heads * head_dim, hidden, quantize=True)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden, quantize=True)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden, quantize=True)
        tensor(f"blk.{i}.attn_output.weight", hidden, heads * head_dim, quantize=True)
        tensor(f"blk.{i}.ffn_norm.weight", hidden, norm=True)
        tensor(f"blk.{i}.ffn_gate.weight", inter, hidden, quantize=True)
        tensor(f"blk.{i}.ffn_up.weight", inter, hidden, quantize=True)
        tensor(f"blk.{i}.ffn_down.weight", hidden, inter, quantize=True)
    tensor("output_norm.weight", hidden, norm=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
