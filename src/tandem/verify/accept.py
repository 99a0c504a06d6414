"""The accept walk shared by the verdict and the emits.

Words: for a sequence with drafts d_0..d_{g-1}, the target's rows give picks
p_0..p_g (p_j follows row j = [last, d_0, ..]). Draft j is *accepted* while it
passes its test, and only while a bonus row j+1 exists; the *bonus* token is
p_accepted: the target's own pick right after the last accepted draft (under
sampling, the residual draw at a rejection, or the draw from p after all).
"""
from __future__ import annotations

from tandem.sampling.noise import STREAM_ACCEPT, uniform


def accepted_prefix(drafts: list[int], picks: list[int]) -> int:
    """Greedy: draft j is accepted while it equals picks[j] and picks[j+1] exists."""
    n = 0
    for j, d in enumerate(drafts):
        if j + 1 >= len(picks) or d != picks[j]:
            break
        n += 1
    return n


def accepted_sampled(drafts: list[int], picks: list[int], accept_probs: list[float], seed: int, start_pos: int) -> int:
    """Sampling: draft j is accepted with probability accept_probs[j] = min(1, p/q), the
    uniform keyed by the position the draft would take (start_pos + j + 1)."""
    n = 0
    for j in range(len(drafts)):
        if j + 1 >= len(picks) or uniform(seed, start_pos + j + 1, STREAM_ACCEPT) >= accept_probs[j]:
            break
        n += 1
    return n
