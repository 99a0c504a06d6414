"""A prefill that scores its prompt (PrefillItem.prompt_logprobs, for echo with logprobs):
the LM head on every row, so row p gives the logprob of token p + 1. The rows run in chunks
of the row budget, each chunk's logits reduced to its logprobs before the next (a long
prompt never holds [len, V] floats)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from tandem.sampling.logprobs import joined, rows_logprobs
from tandem.shard.commands import PrefillItem, RowLogprobs


def score_prompt(forward: Callable, it: PrefillItem, chunk: int, capture: tuple[int, ...],
                 device: torch.device) -> tuple[torch.Tensor, dict[int, torch.Tensor] | None, RowLogprobs]:
    """Write the item's tokens past cached_len into the KV as _forward_prompt does; the
    logits of its last row, the captured layers' rows, and the logprobs of tokens
    cached_len + 1 .. len - 1 (and of it.next_token after the last, when >= 0)."""
    hidden: dict[int, list[torch.Tensor]] = {layer: [] for layer in capture}
    parts, last_logits, total = [], None, len(it.tokens)
    for start in range(it.cached_len, total, chunk):
        ids = it.tokens[start : start + chunk]
        out = forward(torch.tensor(ids, dtype=torch.long, device=device)[None], [list(it.blocks)], [start])
        logits = out.logits[0]  # [len(ids), V]
        last_logits = logits[-1]
        targets = list(it.tokens[start + 1 : start + 1 + len(ids)])
        if start + len(ids) == total and it.next_token >= 0:
            targets.append(it.next_token)
        if targets:
            parts.append(rows_logprobs(logits[: len(targets)], targets, it.prompt_logprobs or 0))
        for layer in capture:
            hidden[layer].append(out.hidden[layer][0])
    captured = {layer: torch.cat(h) for layer, h in hidden.items()} if capture else None
    return last_logits, captured, joined(parts)
