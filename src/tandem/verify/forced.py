"""How many of the grammar's forced tokens join each constrained sequence's drafts.

A forced token (the one token the grammar allows: JSON punctuation, a key's name) costs no
drafter and passes whenever the drafts before it did, but it costs a verify row, and the
draft cap priced the tick's forwards for at most `cap` drafts a sequence. Forced tokens
past the others' drafts make a sequence longer than its batch: every other sequence is
padded to it, or it takes a forward of its own, rows the draft cap never priced. So the
width (drafts + forced a sequence) is chosen as the draft cap is: the most expected tokens per estimated forward millisecond, the
tick's forwards priced as the scheduler batches them (padded merges or one forward per
count), with the sequences' actual draft and forced counts.
"""
from __future__ import annotations

from collections.abc import Callable

from tandem.adaptive import expected_tokens


def forced_width(drafts: list[int], forced: list[int], alphas: list[float],
                 plan_ms: Callable[[list[int]], float | None] | None) -> int | None:
    """The most drafts + forced tokens a sequence keeps (None: all). drafts[i]: sequence
    i's drafter drafts, forced[i]: the forced tokens that could follow them, alphas[i]:
    the chance each of its drafter drafts passes; plan_ms(counts): the tick's estimated
    forward ms for these draft counts (None before it is measured, or without a cost model)."""
    if plan_ms is None or not any(forced):
        return None
    widths = sorted({max(drafts)} | {d + f for d, f in zip(drafts, forced)})
    best, best_rate = None, None
    for w in widths:
        counts = [max(d, min(d + f, w)) for d, f in zip(drafts, forced)]
        ms = plan_ms(counts)
        if ms is None:
            return None  # unmeasured: priced optimistically, as the draft cap does
        # a forced token passes when every drafter draft before it did
        tokens = sum(expected_tokens(a, d) + (c - d) * a**d for a, d, c in zip(alphas, drafts, counts))
        rate = tokens / max(ms, 1e-6)
        if best_rate is None or rate >= best_rate:  # ties: the wider (its tokens are sure)
            best, best_rate = w, rate
    return best
