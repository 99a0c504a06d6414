"""Seeded sampled runs repeat exactly, whatever shares their batch."""
from __future__ import annotations

from tandem.sampling_params import SamplingParams

from .prompts import PROMPTS


def test_a_seeded_request_repeats_alone_and_in_a_batch(make_engine):
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.95, seed=1234)
    other_seed = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.95, seed=99)
    engine = make_engine("ngram")
    alone = engine.generate([PROMPTS[1]], params)[0].token_ids
    # the same request again, among a greedy one, another seed's, and itself under another seed
    mixed = engine.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[1]],
                            [params, SamplingParams(max_tokens=12), SamplingParams(max_tokens=12, temperature=1.0, seed=5),
                             other_seed])
    assert alone == mixed[0].token_ids
    assert mixed[3].token_ids != alone
