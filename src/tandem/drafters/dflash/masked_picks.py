"""A constrained sequence's DFlash drafts, picked under its grammar after the block forward.

A block's logits for draft positions 1..B-1 come in one forward (each position sees mask
tokens, not the picks before it), so the grammar can mask them position by position
afterwards: draft j is picked from position j's logits masked with the grammar's state
after d0..d(j-1) (tandem.grammar.draft_matchers), then the walk takes it. Greedy: the
masked argmax; sampled: a draw with the same row key as an unconstrained sequence's, and
q_j the masked, filtered distribution it came from (the accept rule stays exact). No draft
follows a complete grammar, nor a state whose next tokens all lie outside the drafter's
vocabulary (a checkpoint's draft_vocab).
"""
from __future__ import annotations

import numpy as np
import torch

from tandem.grammar.draft_matchers import DraftWalk
from tandem.sampling.filters import filtered_probs
from tandem.sampling.grammar_mask import unpack
from tandem.sampling.noise import STREAM_DRAFT, row_key, sample_rows
from tandem.shard.commands import SamplingSpec


def draft_allowed(row: np.ndarray, vocab_size: int, draft_vocab: torch.Tensor | None,
                  device: torch.device) -> torch.Tensor:
    """A grammar mask row ([words] int32 bits over the target's vocabulary) as a bool row
    over the drafter's logits: the whole vocabulary, or the draft_vocab ids in their order.
    Tokens past the grammar's vocabulary are refused."""
    bits = unpack(torch.from_numpy(row[None]).to(device))[0]
    if bits.shape[0] < vocab_size:
        bits = torch.nn.functional.pad(bits, (0, vocab_size - bits.shape[0]))
    bits = bits[:vocab_size]
    return bits if draft_vocab is None else bits[draft_vocab]


def masked_picks(logits: torch.Tensor, walk: DraftWalk, count: int, spec: SamplingSpec, first_position: int,
                 draft_vocab: torch.Tensor | None, vocab_size: int) -> tuple[list[int], torch.Tensor | None]:
    """(up to `count` drafts, their q [drafts, vocab_size] for a sampled sequence, else None)
    from one sequence's block logits [>= count, V'] (V' = the draft vocabulary's size when
    there is one). Draft j sits at position first_position + j. The walk advances by the
    drafts; the caller finishes it."""
    drafts: list[int] = []
    qs: list[torch.Tensor] = []
    for j in range(count):
        x = logits[j : j + 1]
        row = walk.row()
        if row is not None:  # None: a matcher in error, the rest draft unmasked (the verify cuts them)
            ok = draft_allowed(row, vocab_size, draft_vocab, x.device)
            if not bool(ok.any()):
                break
            x = x.masked_fill(~ok, float("-inf"))
        if spec.greedy:
            pick = int(x.argmax(dim=-1))
        else:
            q = filtered_probs(x, spec.temperature, spec.top_p, spec.top_k, spec.min_p)  # [1, V']
            pick = int(sample_rows(q, [row_key(spec.seed, first_position + j, STREAM_DRAFT)])[0])
            qs.append(q[0])
        token = pick if draft_vocab is None else int(draft_vocab[pick])
        drafts.append(token)
        walk.take(token)
        if walk.limit is not None:  # the grammar is complete (or refused the draft): nothing after it
            del drafts[walk.limit :], qs[walk.limit :]
            break
    if not qs:
        return drafts, None
    q = torch.stack(qs).float()  # [drafts, V']
    if draft_vocab is not None:  # q over the whole vocabulary: 0 outside the draft vocab
        q = torch.zeros(len(qs), vocab_size, device=q.device).index_copy_(1, draft_vocab, q)
    return drafts, q
