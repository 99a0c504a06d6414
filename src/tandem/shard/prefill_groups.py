"""Which prompts of a prefill share one forward.

One forward per prompt paid a whole pass over the weights for every prompt: launch-bound
on a GPU (a 64-prompt wave cost 64 eager forwards, ~2 s, on an H200) and weight-bound
for short prompts on a CPU. Prompts of similar length now go together, padded at their
end to the longest one: at most `row_budget` rows a forward, and no prompt shorter than
half its group's width (padding at most doubles a group's rows). A prompt longer than
the budget goes alone, in chunks.
"""
from __future__ import annotations


def prefill_groups(lengths: list[int], row_budget: int) -> list[list[int]]:
    """Indices into `lengths`, grouped; every index once, longest prompts first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        width = lengths[g[0]] if g else 0  # the group's first prompt is its longest
        if g and 2 * lengths[i] >= width and (len(g) + 1) * width <= row_budget:
            g.append(i)
        else:
            groups.append([i])
    return groups
