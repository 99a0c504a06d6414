"""The scheduler's half of a constrained verify: the drafts are known before the forward,
so each verify row's mask is the grammar's state after the drafts before it.

Walk the sequence's matcher through d0..d(g-1), filling row j (the state after d0..d(j-1))
before trying d_j, then roll the matcher back: it advances only by what is emitted
(Sequence.emit). A draft the grammar refuses cuts the drafts: a greedy sequence drops it
and every draft after it (its row would be rejected anyway); a sampled one keeps it as
its last draft, whose sure rejection (p(d) = 0 under the mask) draws its pick from the
residual max(0, p - q): the accept rule stays exact for a drafter's q however it drafted.
"""
from __future__ import annotations

import numpy as np


def fill_row(matcher, rows: np.ndarray, j: int) -> None:
    from llguidance.numpy import fill_next_token_bitmask

    fill_next_token_bitmask(matcher, rows, j)
    if not rows[j].any():  # a stopped grammar: its row's pick is never read (the sequence ends)
        rows[j] = -1


def is_allowed(rows: np.ndarray, j: int, token: int) -> bool:
    return bool((int(rows[j, token >> 5]) >> (token & 31)) & 1)


def constrained_rows(matcher, drafts: list[int], words: int, keep_refused: bool) -> tuple[list[int], np.ndarray]:
    """(the drafts the grammar lets through, their len+1 mask rows [rows, words] int32)."""
    rows = np.full((len(drafts) + 1, words), -1, dtype=np.int32)
    consumed = 0
    kept = drafts
    for j, d in enumerate(drafts):
        fill_row(matcher, rows, j)
        if not is_allowed(rows, j, d) or not matcher.consume_token(d):
            kept = drafts[: j + 1] if keep_refused else drafts[:j]
            break
        consumed += 1
    else:
        fill_row(matcher, rows, len(drafts))
    if consumed:
        matcher.rollback(consumed)
    return kept, rows[: len(kept) + 1]


def padded_mask(rows: np.ndarray, k: int) -> bytes:
    """The rows, then pad rows (never read) allowing every token, up to k."""
    if len(rows) < k:
        rows = np.concatenate([rows, np.full((k - len(rows), rows.shape[1]), -1, dtype=np.int32)])
    return rows.astype("<i4", copy=False).tobytes()


def start_mask(matcher, words: int) -> bytes:
    """One row: what the grammar allows next (a prefill's pick)."""
    rows = np.full((1, words), -1, dtype=np.int32)
    fill_row(matcher, rows, 0)
    return rows.astype("<i4", copy=False).tobytes()



def with_forced(matcher, drafts: list[int], room: int) -> tuple[list[int], list[int]]:
    """(the drafts the grammar takes, up to `room` tokens it forces after them: JSON
    punctuation, a key's name; drafts that cost no drafter and that the target, picking
    under the same mask, mostly accepts). The matcher ends where it began."""
    consumed = matcher.try_consume_tokens(drafts) if drafts else 0
    forced = matcher.compute_ff_tokens()[:room] if consumed == len(drafts) and room > 0 else []
    if consumed:
        matcher.rollback(consumed)
    return drafts[:consumed], forced
