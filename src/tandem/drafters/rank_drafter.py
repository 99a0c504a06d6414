"""The protocol of a drafter that lives on a shard rank beside the target.

Drafters that need a model (a draft model; DFlash, which reads the target's hidden
states) run on rank 0 next to the target's KV, and are driven by the shard:
prefill and commit come from the target's own commands, propose from a
ProposeBatch. The scheduler reaches them through drafters.rank_proxy.
"""
from __future__ import annotations

from typing import Protocol

import torch

from tandem.shard.commands import DraftGrammar, SamplingSpec


class RankDrafter(Protocol):
    name: str
    # Target layers whose output rows the drafter wants (DFlash); () for none.
    capture_layers: tuple[int, ...]
    # Most sequences one batched propose takes.
    propose_batch_max: int

    def set_table(self, slot: int, table: list[int]) -> None:
        """The slot's block table in the target's pool, as the command at hand carries it (a
        drafter whose context follows the target's layout keeps it; others ignore it)."""
        ...

    def prefill(self, slot: int, tokens: list[int], feats: torch.Tensor | None, cached_len: int = 0) -> None:
        """A sequence's known tokens, and the target's captured rows for tokens[cached_len:]:
        the capture_layers' outputs side by side in that order, [len - cached_len,
        len(capture_layers) * H] (None without captures). The first cached_len positions are
        a prefix whose blocks the prefix cache shared: the target computed nothing there."""
        ...

    def propose(
        self,
        slots: list[int],
        histories: list[list[int]],  # each slot's committed tokens (positions 0..P-1)
        last_tokens: list[int],  # the token at position P, not yet in the target's KV
        num_drafts: list[int],
        sampling: list[SamplingSpec],
        grammars: list[DraftGrammar | None] | None = None,  # each constrained sequence's, or None
    ) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        """Drafts for a batch, and for sampled sequences the draft distribution q [g, V]
        (the one the drafts were drawn from: masked, for a drafter that drafts under the
        grammars). A drafter may ignore the grammars: the verify cuts what they refuse."""
        ...

    def commit(self, slot: int, start_pos: int, rows: int, feats: torch.Tensor | None) -> None:
        """The verdict kept `rows` rows of the target from start_pos on (accepted + 1);
        trim what the drafter guessed past them. feats: the kept rows' captures, as in prefill."""
        ...

    def committed(self, slots: list[int], last_tokens: list[int]) -> None:
        """Every sequence of a verify batch that drafted has been committed, and last_tokens
        are the tokens each emitted last (its bonus token, the next propose's last token):
        work the next propose needs may start now (on a GPU it then runs while the scheduler
        handles the verdict)."""
        ...

    def release(self, slots: list[int]) -> None:
        """The sequences of these slots are gone (finished, preempted or prefilled anew)."""
        ...
