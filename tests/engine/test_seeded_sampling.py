"""Seeded sampled runs repeat exactly, whatever shares their batch."""
from __future__ import annotations

from tandem.sampling_params import SamplingParams

from .prompts import PROMPTS


def test_a_seeded_request_repeats_alone_and_in_a_batch(make_engine):
    params = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=1234)
    engine = make_engine("ngram")
    alone = engine.generate([PROMPTS[1]], params)[0].token_ids
    again = engine.generate([PROMPTS[1]], params)[0].token_ids
    mixed = engine.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [params, SamplingParams(max_tokens=20), SamplingParams(max_tokens=20, temperature=1.0, seed=5)])
    assert alone == again == mixed[0].token_ids
    other_seed = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=99))[0].token_ids
    assert other_seed != alone
