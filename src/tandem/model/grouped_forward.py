"""One forward of several rectangles of rows: a verify's n x k rows and prompt chunks of
other widths, side by side.

Every linear layer (the weights, which a decode step is bound by reading) runs once over
all of the rows; each rectangle's attention reads its own sequences (RowPlaces.attend).
So a chunk of a new prompt rides on the running sequences' verify forward instead of
taking a forward of its own: running streams do not wait for the prompts that arrive.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.model.llama import ModelOutput
from tandem.model.row_places import RowPlaces


@dataclass
class RowRectangle:
    """n sequences x width rows: tokens [n, width], start_pos [n] int32 and tables [n, W]
    int32 on the model's device, as LlamaForCausalLM.forward takes them; logit_rows: the
    rows (0..width-1) of each sequence that need logits, or None for every row."""

    tokens: torch.Tensor
    start_pos: torch.Tensor
    tables: torch.Tensor
    logit_rows: list[list[int]] | None = None


def forward_groups(model, cache, rectangles: list[RowRectangle], capture_layers: tuple[int, ...] = ()) -> list[ModelOutput]:
    """What model.forward returns for each rectangle on its own, from one forward:
    logits [n, m, vocab] (m = every row, or its logit_rows' count), hidden [n, width, H]."""
    where = RowPlaces.of_groups([(r.tables, r.start_pos, r.tokens.shape[1]) for r in rectangles], cache.block_size)
    tokens = torch.cat([r.tokens.reshape(-1) for r in rectangles])[None]
    picked, counts = [], []
    for r, g in zip(rectangles, where.groups):
        rows = r.logit_rows if r.logit_rows is not None else [list(range(g.width))] * g.n
        counts.append(len(rows[0]) if rows else 0)
        picked += [g.first + i * g.width + j for i, seq_rows in enumerate(rows) for j in seq_rows]
    logit_rows = torch.tensor(picked, dtype=torch.long).to(tokens.device, non_blocking=True)[None]
    out = model.run_rows(tokens, where, cache, capture_layers, logit_rows)
    results, at = [], 0
    for g, m in zip(where.groups, counts):
        logits = out.logits[0, at : at + g.n * m].view(g.n, m, out.logits.shape[-1])
        at += g.n * m
        hidden = {layer: h[0, g.first : g.first + g.n * g.width].view(g.n, g.width, -1) for layer, h in out.hidden.items()}
        results.append(ModelOutput(logits=logits, hidden=hidden))
    return results
