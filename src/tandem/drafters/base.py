"""The one protocol every scheduler-side drafter implements.

The verify step calls only these methods; nothing outside drafters.factory
branches on a drafter's kind. Drafters with a model live on the shard ranks
(drafters.rank_drafter) and are reached through RankDrafterProxy, which is
itself a Drafter.
"""
from __future__ import annotations

from typing import Protocol

from tandem.sequence import Sequence


class Drafter(Protocol):
    name: str
    # Most sequences one batched propose takes (the caller chunks by it).
    propose_batch_max: int
    # A propose costs the same whatever the draft count (DFlash drafts a whole block in one
    # forward): each sequence then keeps its full draft count, and a propose is priced as one step.
    whole_blocks: bool
    # Sequences of the last propose drafted for next to nothing (copy first's lookups): a
    # propose is timed by the others (tandem.adaptive.BatchCostModel.record_propose).
    copied: int

    def propose(self, seqs: list[Sequence], num_drafts: list[int]) -> list[list[int]]:
        """Batched: up to num_drafts[i] drafts for seqs[i]. May raise; the caller then
        falls back to propose_one for each sequence."""
        ...

    def propose_one(self, seq: Sequence, num_drafts: int) -> list[int]:
        """One sequence alone (the fallback path)."""
        ...

    def on_commit(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """After a verdict: trim any drafter state past the accepted drafts."""
        ...

    def release(self, seq: Sequence) -> None:
        ...
