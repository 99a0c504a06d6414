"""The scheduler-side face of a rank-side drafter: proposes through the shard group."""
from __future__ import annotations

from tandem.sequence import Sequence
from tandem.shard.commands import DraftGrammar, ProposeBatch


class RankDrafterProxy:
    def __init__(self, group, name: str, whole_blocks: bool = False):
        self.group = group
        self.name = name
        self.propose_batch_max = group.limits.propose_batch_max
        self.whole_blocks = whole_blocks
        self.copied = 0

    def propose(self, seqs: list[Sequence], num_drafts: list[int]) -> list[list[int]]:
        cmd = ProposeBatch(
            slots=[s.slot for s in seqs],
            last_tokens=[s.last_token for s in seqs],
            positions=[s.kv_len for s in seqs],
            num_drafts=list(num_drafts),
            sampling=[s.sampling for s in seqs],
            grammars=grammars(seqs),
        )
        res = self.group.propose(cmd)
        if len(res.drafts) != len(seqs):
            raise RuntimeError(f"propose returned {len(res.drafts)} draft lists for {len(seqs)} sequences")
        return [d[:g] for d, g in zip(res.drafts, num_drafts)]

    def propose_one(self, seq: Sequence, num_drafts: int) -> list[int]:
        return self.propose([seq], [num_drafts])[0]

    def on_commit(self, seq: Sequence, drafted: int, accepted: int) -> None:
        pass  # the rank trims its drafter when it gets the verdict

    def release(self, seq: Sequence) -> None:
        pass  # the rank frees its drafter's slot on release


def grammars(seqs: list[Sequence]) -> list[DraftGrammar | None]:
    """Each constrained sequence's grammar for the rank's drafter, from its output's start
    ([] when none is constrained: nothing travels)."""
    if all(s.grammar is None for s in seqs):
        return []
    return [DraftGrammar(s.params.structured.kind, s.params.structured.value, len(s.prompt_ids))
            if s.grammar is not None else None for s in seqs]
