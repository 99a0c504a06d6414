"""Where a forward's rows go in the paged cache, and the attention over what they see.

A forward is one rectangle of n sequences x k rows, or (`RowPlaces.of_groups`) several
rectangles side by side in one row of rows: a verify's n x k rows and prompt chunks of
other widths share the GEMMs of one forward, and only the attention, which reads each
rectangle's sequences, runs once per rectangle.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.model.paged_attention import paged_attention


@dataclass
class RowGroup:
    """One rectangle of a grouped forward: n_g sequences x width rows, at flat rows
    [first, first + n_g * width) of the forward, with its tables [n_g, W] and start_pos [n_g]."""

    first: int
    n: int
    width: int
    tables: torch.Tensor
    start_pos: torch.Tensor


@dataclass
class RowPlaces:
    """tables [n, W] int32 (each sequence's blocks, padded with the scratch block),
    start_pos [n] int32, and per row its position, block and offset ([n, k] each). A
    grouped forward has n = 1, k = every group's rows, and `groups`; tables and start_pos
    are then those of its first group (unused)."""

    tables: torch.Tensor
    start_pos: torch.Tensor
    positions: torch.Tensor
    blocks: torch.Tensor
    offsets: torch.Tensor
    groups: list[RowGroup] | None = None

    @classmethod
    def of(cls, tables: torch.Tensor, start_pos: torch.Tensor, k: int, block_size: int) -> "RowPlaces":
        pos = start_pos.long()[:, None] + torch.arange(k, device=start_pos.device)  # [n, k]
        blocks = tables.long().gather(1, pos // block_size)
        return cls(tables=tables, start_pos=start_pos.int(), positions=pos, blocks=blocks, offsets=pos % block_size)

    @classmethod
    def of_groups(cls, groups: list[tuple[torch.Tensor, torch.Tensor, int]], block_size: int) -> "RowPlaces":
        """groups: (tables [n_g, W_g], start_pos [n_g], width) of each rectangle, in row order."""
        parts, placed, first = [], [], 0
        for tables, start_pos, width in groups:
            part = cls.of(tables, start_pos, width, block_size)
            parts.append(part)
            placed.append(RowGroup(first, tables.shape[0], width, tables, part.start_pos))
            first += tables.shape[0] * width
        flat = lambda name: torch.cat([getattr(p, name).reshape(-1) for p in parts])[None]  # noqa: E731
        return cls(tables=parts[0].tables, start_pos=parts[0].start_pos, positions=flat("positions"),
                   blocks=flat("blocks"), offsets=flat("offsets"), groups=placed)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """paged_attention of q [n, k, hq, d] (rows already written to the cache), each
        group over its own sequences."""
        if self.groups is None:
            return paged_attention(q, k_cache, v_cache, self.tables, self.start_pos)
        hq, d = q.shape[2:]
        outs = []
        for g in self.groups:
            rows = q[0, g.first : g.first + g.n * g.width].reshape(g.n, g.width, hq, d)
            outs.append(paged_attention(rows, k_cache, v_cache, g.tables, g.start_pos).reshape(-1, hq, d))
        return torch.cat(outs)[None]
