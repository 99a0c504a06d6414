"""The n-gram drafter's array lookup proposes exactly what a plain scan of the history does."""
from __future__ import annotations

import random

import numpy as np

from tandem.drafters.ngram import NgramDrafter, lookup
from tandem.sampling_params import SamplingParams
from tandem.sequence import Sequence


def scan(tokens: list[int], num_drafts: int, min_ngram: int, max_ngram: int) -> list[int]:
    """The reference: walk every earlier start, most recent first."""
    if num_drafts <= 0:
        return []
    L = len(tokens)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        suffix = tokens[L - n :]
        best: list[int] = []
        for start in range(L - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                cont = tokens[start + n : start + n + num_drafts]
                if len(cont) == num_drafts:
                    return cont
                if len(cont) > len(best):
                    best = cont
        if best:
            return best
    return []


def test_lookup_equals_the_plain_scan_on_random_histories():
    rng = random.Random(0)
    for _ in range(3000):
        vocab = rng.choice([2, 3, 5, 50])  # small vocabularies: many (and overlapping) matches
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        g, lo = rng.randint(0, 6), rng.randint(1, 3)
        hi = rng.randint(lo, 5)
        assert lookup(np.array(tokens, dtype=np.int64), g, lo, hi) == scan(tokens, g, lo, hi), (tokens, g, lo, hi)


def _seq(prompt: list[int]) -> Sequence:
    return Sequence(request_id="r", prompt=None, prompt_ids=prompt, params=SamplingParams(max_tokens=100), seed=0,
                    eos_ids=frozenset(), max_model_len=1000, arrival=0.0)


def test_the_history_follows_the_sequence_as_it_grows_and_keeps_to_the_window():
    rng = random.Random(1)
    d = NgramDrafter(max_ngram=3, min_ngram=1, window=64)
    s = _seq([rng.randrange(4) for _ in range(30)])
    for _ in range(200):  # past the buffer's first size and the window
        g = rng.randint(1, 5)
        assert d.propose_one(s, g) == scan(s.all_ids[-64:], g, 1, 3)
        s.output_ids.extend(rng.randrange(4) for _ in range(rng.randint(1, 4)))
    d.release(s)
    assert s.drafter_state is None
