"""A tiny random-weight Llama that speaks through the default model's tokenizer and chat
template: for tests whose point is the plumbing around a model (handles, streams,
actors), not what the real model writes. It loads in a fraction of a second and
generates hundreds of tokens a second on a CPU."""
from __future__ import annotations

import os
import shutil

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def make_tiny_chat_model(folder: str) -> str:
    """Write the tiny model into `folder` (config.json, model.safetensors, the tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tandem.model.loader import resolve_model_folder

    _, source = resolve_model_folder(None)
    like = AutoConfig.from_pretrained(source)
    config = type(like)(
        vocab_size=like.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=like.max_position_embeddings,
        tie_word_embeddings=True, bos_token_id=like.bos_token_id, eos_token_id=like.eos_token_id,
        pad_token_id=like.pad_token_id,
        initializer_range=0.5,  # logits far apart: greedy picks do not hang on rounding
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), os.path.join(folder, name))
    return folder
