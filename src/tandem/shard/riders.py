"""Prompt chunks that ride on a verify (VerifyBatch.prefill): one forward of the batch's
n x k rows and the chunks' rows (tandem.model.grouped_forward).

A chunk is prefilled as PrefillItem says (its tokens past cached_len into the KV, the pick
after its last token); riding, it shares the verify's pass over the weights, so a burst
of new prompts costs running streams the chunks' compute, not whole forwards of their
own. Chunks of similar length share one rectangle, padded at their end (pad rows write
past their sequence's length, where its next forward writes before it reads).
"""
from __future__ import annotations

import torch

from tandem.model.grouped_forward import RowRectangle, forward_groups
from tandem.model.llama import ModelOutput
from tandem.shard.commands import PrefillItem, VerifyBatch
from tandem.shard.prefill_groups import prefill_groups


def forward_with_riders(model, cache, cmd: VerifyBatch, rows: torch.Tensor, capture: tuple[int, ...],
                        row_budget: int) -> tuple[ModelOutput, list[tuple[torch.Tensor, dict[int, torch.Tensor] | None]]]:
    """The verify's output (as its own forward gives it) and, per chunk, the logits of its
    last row [V] and its captured layers' rows ([fresh, H] each, or None)."""
    device = rows.device
    riders = cmd.prefill
    fresh = [len(it.tokens) - it.cached_len for it in riders]
    verify = RowRectangle(tokens=rows, start_pos=_ints(cmd.start_pos, device),
                          tables=cache.table_tensor(list(cmd.block_tables), max(cmd.start_pos) + cmd.k))
    groups = prefill_groups(fresh, row_budget)
    rectangles = [verify] + [_chunks_rectangle(cache, [riders[i] for i in g], device) for g in groups]
    outs = forward_groups(model, cache, rectangles, capture)
    per_item: list = [None] * len(riders)
    for g, out in zip(groups, outs[1:]):
        for row, i in enumerate(g):
            hidden = {layer: h[row, : fresh[i]] for layer, h in out.hidden.items()} if capture else None
            per_item[i] = (out.logits[row, 0], hidden)
    return outs[0], per_item


def _chunks_rectangle(cache, items: list[PrefillItem], device: torch.device) -> RowRectangle:
    fresh = [len(it.tokens) - it.cached_len for it in items]
    width = max(fresh)
    tokens = torch.zeros(len(items), width, dtype=torch.long)
    for i, it in enumerate(items):
        tokens[i, : fresh[i]] = torch.tensor(it.tokens[it.cached_len :], dtype=torch.long)
    starts = [it.cached_len for it in items]
    return RowRectangle(tokens=tokens.to(device), start_pos=_ints(starts, device),
                        tables=cache.table_tensor([list(it.blocks) for it in items], max(starts) + width),
                        logit_rows=[[f - 1] for f in fresh])


def _ints(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)
