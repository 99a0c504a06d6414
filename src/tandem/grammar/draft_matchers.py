"""The rank's half of drafting under a grammar: a model drafter's every step is masked
with the grammar's state after the drafts before it, so it proposes only what the grammar
takes (an unmasked draft the grammar refuses is cut by the scheduler, and the drafts after
it with it).

The model drafters (the draft model, DFlash) run on rank 0 and the scheduler's matchers
stay on the scheduler (one round trip a draft step would cost more than the step), so
rank 0 keeps a matcher of its own for each constrained slot, built from the DraftGrammar
the propose carries and advanced by the slot's committed tokens, which the rank holds
already. It is only ever a guide: the scheduler walks the drafts with its own matcher
before the verify (cutting any the grammar refuses) and masks the target's rows itself,
and the accept rule is exact for any q the drafts were drawn from. A sequence whose
matcher cannot be had (a grammar that fails to compile here, a committed token it
refuses) drafts unmasked beside the others: the verify cuts what the grammar refuses.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from tandem.grammar.constraint import GrammarConstraint
from tandem.grammar.verify_masks import fill_row
from tandem.sampling.grammar_mask import unpack
from tandem.shard.commands import DraftGrammar

log = logging.getLogger("tandem.grammar")

@dataclass
class _SlotMatcher:
    grammar: DraftGrammar
    matcher: object  # llguidance LLMatcher
    consumed: list[int]  # the output tokens it has taken, in order


class DraftWalk:
    """One propose's walk of one sequence's matcher through its drafts; `finish` puts the
    matcher back where the committed tokens left it."""

    def __init__(self, matcher, words: int):
        self.matcher = matcher
        self.words = words
        self.taken = 0
        self.alive = True
        # drafts worth verifying: set when the grammar is complete (nothing after it is
        # emitted) or refused a draft (a matcher the mask disagrees with); None = all
        self.limit: int | None = None

    def row(self) -> np.ndarray | None:
        """The tokens the grammar allows next ([words] int32 bits), or None once refused."""
        if not self.alive:
            return None
        rows = np.empty((1, self.words), dtype=np.int32)
        try:
            fill_row(self.matcher, rows, 0)
        except Exception as e:  # noqa: BLE001 - a matcher in error: the rest draft unmasked
            log.warning("draft mask failed: %s", e)
            self.alive = False
            return None
        return rows[0]

    def take(self, token: int) -> None:
        if not self.alive:
            return
        # validated first: consuming a refused token would leave the matcher in error for good
        if self.matcher.validate_tokens([token]) == 1 and self.matcher.consume_token(token):
            self.taken += 1
            if not self.matcher.is_stopped():
                return
        self.alive, self.limit = False, self.taken

    def finish(self) -> None:
        if self.taken:
            self.matcher.rollback(self.taken)
        self.taken, self.alive = 0, False


class DraftMatchers:
    """Rank 0's matchers, one a constrained slot, kept at the slot's committed tokens."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(eos_ids)
        self._compiler = None  # built on the first constrained propose (its tokenizer takes ~0.5 s)
        self._slots: dict[int, _SlotMatcher] = {}

    def walks(self, slots: list[int], histories: list[list[int]], last_tokens: list[int],
              grammars: list[DraftGrammar | None] | None) -> list[DraftWalk | None]:
        """A walk for each constrained sequence whose matcher could be brought to its
        committed tokens (history, then the last token), None for every other."""
        if not grammars or not any(grammars):
            return [None] * len(slots)
        out: list[DraftWalk | None] = []
        for slot, h, last, g in zip(slots, histories, last_tokens, grammars):
            m = self._matcher(slot, h, last, g) if g is not None else None
            out.append(DraftWalk(m, self.compiler().words) if m is not None else None)
        return out

    def release(self, slot: int) -> None:
        self._slots.pop(slot, None)

    def compiler(self):
        if self._compiler is None:
            from tandem.grammar.compiler import GrammarCompiler

            self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_ids)
        return self._compiler

    def _matcher(self, slot: int, history: list[int], last: int, g: DraftGrammar):
        output = history[g.start :] + [last]
        kept = self._slots.get(slot)
        n = len(kept.consumed) if kept is not None else 0
        if kept is None or kept.grammar != g or n > len(output) or kept.consumed != output[:n]:
            try:  # the slot's first constrained propose, or a slot reused since
                kept = _SlotMatcher(g, self.compiler().matcher(GrammarConstraint(g.kind, g.value)), [])
            except Exception as e:  # noqa: BLE001 - no mask: the sequence drafts unmasked
                log.warning("no draft mask for slot %d: %s", slot, e)
                self._slots.pop(slot, None)
                return None
            self._slots[slot] = kept
            n = 0
        fresh = output[n:]
        if fresh and kept.matcher.try_consume_tokens(fresh) != len(fresh):
            self._slots.pop(slot, None)  # the grammar refused a committed token: the sequence is ending
            return None
        kept.consumed.extend(fresh)
        return kept.matcher


def mask_draft_logits(logits: torch.Tensor, walks: list[DraftWalk | None]) -> torch.Tensor:
    """logits [n, V] with each walking row's refused tokens at -inf (tokens past the
    grammar's vocabulary too); rows without a walk as they are."""
    rows = [(i, w.row()) for i, w in enumerate(walks) if w is not None]
    rows = [(i, r) for i, r in rows if r is not None]
    if not rows:
        return logits
    n_vocab = logits.shape[-1]
    words = torch.from_numpy(np.stack([r for _, r in rows])).to(logits.device)
    bits = unpack(words)  # [c, 32 * words]
    if bits.shape[1] < n_vocab:
        bits = torch.nn.functional.pad(bits, (0, n_vocab - bits.shape[1]))  # past the grammar's tokens: refused
    index = torch.tensor([i for i, _ in rows], device=logits.device)
    logits = logits.clone()
    logits[index] = logits[index].masked_fill(~bits[:, :n_vocab], float("-inf"))
    return logits
