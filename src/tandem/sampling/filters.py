"""Turn logits into the distribution a request samples from: temperature, top-k, min-p, top-p.

The same filter is applied to the target's p and the draft model's q, as the
lossless rule requires.
"""
from __future__ import annotations

import math

import torch


def filtered_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int, min_p: float = 0.0) -> torch.Tensor:
    """logits [R, V] -> probs [R, V] (float32), for one request's settings (temperature > 0).
    min_p keeps the tokens of at least min_p times the top token's probability (after the
    temperature, as vLLM); it commutes with top-k, and comes before top-p."""
    x = logits.float() / temperature
    vocab = x.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]  # [R, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if min_p > 0.0:  # p_i >= min_p * p_max  <=>  x_i >= x_max + log(min_p)
        floor = x.max(dim=-1, keepdim=True).values + math.log(min_p)
        x = x.masked_fill(x < floor, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p (the first always stays)
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs
