"""N-gram prompt lookup (Saxena's prompt lookup decoding): find the sequence's last
n tokens earlier in its own history and propose what followed them there.

Runs in the scheduler (no model); its q is one-hot at the draft. Each sequence's
history lives in a numpy buffer that grows with its tokens (seq.drafter_state), so a
propose compares arrays in C instead of walking the window in Python (4k tokens:
~1.2 ms a sequence a tick as a Python scan).
"""
from __future__ import annotations

import numpy as np

from tandem.sequence import Sequence


class NgramDrafter:
    name = "ngram"
    propose_batch_max = 1 << 30
    whole_blocks = False
    copied = 0  # its lookups are its own path: each propose is timed for all its sequences

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, window: int = 4096):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.window = window

    def propose(self, seqs: list[Sequence], num_drafts: list[int]) -> list[list[int]]:
        return [self.propose_one(s, g) for s, g in zip(seqs, num_drafts)]

    def propose_one(self, seq: Sequence, num_drafts: int) -> list[int]:
        if not isinstance(seq.drafter_state, _History):
            seq.drafter_state = _History()
        tokens = seq.drafter_state.update(seq)
        return lookup(tokens[-self.window :], num_drafts, self.min_ngram, self.max_ngram)

    def on_commit(self, seq: Sequence, drafted: int, accepted: int) -> None:
        pass  # the history only grows: rejected drafts never entered it

    def release(self, seq: Sequence) -> None:
        seq.drafter_state = None


class _History:
    """A sequence's prompt and output tokens in one array that grows as they do."""

    def __init__(self):
        self.buf = np.empty(256, dtype=np.int64)
        self.n = 0

    def update(self, seq: Sequence) -> np.ndarray:
        p = len(seq.prompt_ids)
        total = p + len(seq.output_ids)
        if total > len(self.buf):
            grown = np.empty(max(total, 2 * len(self.buf)), dtype=np.int64)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        if self.n < p:
            self.buf[self.n : p] = seq.prompt_ids[self.n :]
            self.n = p
        if self.n < total:
            self.buf[self.n : total] = seq.output_ids[self.n - p :]
            self.n = total
        return self.buf[: self.n]


def lookup(tokens: np.ndarray, num_drafts: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Longest suffix n-gram first; its most recent earlier match with a full
    continuation wins, else the match with the longest continuation (the oldest)."""
    L = len(tokens)
    top = min(max_ngram, L - 1)
    if num_drafts <= 0 or top < min_ngram:
        return []
    # levels[j]: the ends e (< L-1) of earlier (j+1)-grams equal to the suffix's last j+1
    # tokens. One pass over the history finds where its last token recurs; each longer
    # n-gram only filters the few survivors (a pass per n and per token of it took 5x as long).
    level = np.flatnonzero(tokens[: L - 1] == tokens[L - 1])
    levels = [level]
    for j in range(1, top):
        if level.size == 0:
            break
        level = level[level >= j]
        level = level[tokens[level - j] == tokens[L - 1 - j]]
        levels.append(level)
    for n in range(min(len(levels), top), min_ngram - 1, -1):
        if levels[n - 1].size == 0:
            continue
        starts = levels[n - 1] - (n - 1)
        full = starts[starts <= L - n - num_drafts]
        s = int(full[-1]) if full.size else int(starts[0])
        return tokens[s + n : s + n + num_drafts].tolist()
    return []
