"""N-gram prompt lookup (Saxena's prompt lookup decoding): find the sequence's last
n tokens earlier in its own history and propose what followed them there.

Runs in the scheduler (no model); its q is one-hot at the draft.
"""
from __future__ import annotations

from tandem.sequence import Sequence


class NgramDrafter:
    name = "ngram"
    propose_batch_max = 1 << 30

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, window: int = 4096):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram sizes: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.window = window

    def propose(self, seqs: list[Sequence], num_drafts: list[int]) -> list[list[int]]:
        return [self.propose_one(s, g) for s, g in zip(seqs, num_drafts)]

    def propose_one(self, seq: Sequence, num_drafts: int) -> list[int]:
        return lookup(seq.all_ids[-self.window :], num_drafts, self.min_ngram, self.max_ngram)

    def on_commit(self, seq: Sequence, drafted: int, accepted: int) -> None:
        pass  # stateless: the history is the state

    def release(self, seq: Sequence) -> None:
        pass


def lookup(tokens: list[int], num_drafts: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Longest suffix n-gram first; its most recent earlier match with a full
    continuation wins, else the most recent match's shorter continuation."""
    if num_drafts <= 0:
        return []
    L = len(tokens)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        suffix = tokens[L - n :]
        best: list[int] = []
        for start in range(L - n - 1, -1, -1):  # most recent first, never the suffix itself
            if tokens[start : start + n] == suffix:
                cont = tokens[start + n : start + n + num_drafts]
                if len(cont) == num_drafts:
                    return cont
                if len(cont) > len(best):
                    best = cont
        if best:
            return best
    return []
