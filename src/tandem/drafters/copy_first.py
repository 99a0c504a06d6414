"""Copy first: a model drafter (DFlash, a draft model) whose sequences draft by n-gram
prompt lookup wherever their last few tokens recur in their own context.

Where an output copies its context (a rewrite, a translation's names and numbers, code
quoted back, a long passage asked about) the copy is the better guess: prompt lookup
proposes the continuation exactly, where a small model drafts it token by token. Elsewhere
the lookup finds no long match and the model drafts. Per sequence and per round: the
lookup wins when the sequence's last `min_match` tokens (at least) recur earlier in its
context; the rest of the batch goes to the model drafter in one batched propose, and so
do sequences under a grammar (the model drafts under it: a copy could break it).

The rank side needs nothing: the target's rows of every kept token reach a rank-side
drafter through the verify's commit whoever drafted, and the rank gives a draft it did not
propose a one-hot q (tandem.shard.model_shard), as the n-gram drafter's drafts have.
"""
from __future__ import annotations

from tandem.drafters.ngram import NgramDrafter
from tandem.sequence import Sequence


class CopyFirstDrafter:
    def __init__(self, model_drafter, min_match: int, max_match: int):
        self.model_drafter = model_drafter
        self.lookup = NgramDrafter(max_ngram=max(min_match, max_match), min_ngram=min_match)
        self.name = model_drafter.name
        self.propose_batch_max = model_drafter.propose_batch_max
        self.whole_blocks = model_drafter.whole_blocks
        self.copied = 0  # sequences of the last propose the lookup drafted for

    def propose(self, seqs: list[Sequence], num_drafts: list[int]) -> list[list[int]]:
        # a constrained sequence keeps the model's drafts, made under its grammar (a copy may
        # break the grammar, and the verify would cut it)
        out = [self.lookup.propose_one(s, g) if s.grammar is None else [] for s, g in zip(seqs, num_drafts)]
        rest = [i for i, d in enumerate(out) if not d]
        self.copied = len(seqs) - len(rest)
        if rest:
            drafted = self.model_drafter.propose([seqs[i] for i in rest], [num_drafts[i] for i in rest])
            for i, d in zip(rest, drafted):
                out[i] = d
        return out

    def propose_one(self, seq: Sequence, num_drafts: int) -> list[int]:
        return self.propose([seq], [num_drafts])[0]

    def on_commit(self, seq: Sequence, drafted: int, accepted: int) -> None:
        self.model_drafter.on_commit(seq, drafted, accepted)

    def release(self, seq: Sequence) -> None:
        self.lookup.release(seq)
        self.model_drafter.release(seq)
